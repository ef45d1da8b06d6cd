"""The one persisted job lifecycle that training, evaluation and OpenEnv runs share."""
