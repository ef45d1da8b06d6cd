# Sourced by scripts/serve and scripts/test: the scorer sandbox's bubblewrap and its dedicated
# unprivileged user (the code creates the user too, when it runs as root), so the guide's first
# rollout-generate does not fail with sandbox_unavailable.
if ! command -v bwrap >/dev/null; then
  echo "kiln: installing bubblewrap for the scorer sandbox"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
  else sudo apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null; fi
fi
if [ "$(id -u)" = 0 ] && ! id kiln-sandbox >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kiln-sandbox
fi
