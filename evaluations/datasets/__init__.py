"""Evaluation datasets: pure row parsing (`formats`) and the deterministic train/validation/holdout
split (`split`). Neither imports Django or torch; the services that store datasets are
`evaluations.dataset_services` and `evaluations.dataset_selectors`."""
