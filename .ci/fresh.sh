#!/usr/bin/env bash
# Runs one of the README's two commands in a throwaway root of pristine Debian,
# from a fresh clone of the committed HEAD, as a newcomer would:
#
#   bash .ci/fresh.sh SUITE WHO COMMAND
#     SUITE    bookworm (Debian 12) | trixie (Debian 13)
#     WHO      root  the command runs as root, which may apt-get what is missing
#              user  an administrator (root) installs MPICH, libclang and a
#                    system-wide Rust first; then an unprivileged user with no
#                    sudo clones the repository and runs the command
#     COMMAND  quickstart | test    (bash scripts/quickstart.sh | bash scripts/test.sh)
#
# The pristine root comes from the workplace's fresh-machine harness
# (FANSTORE_FRESH_HARNESS, default ../shared/fresh beside the checkout): a
# debootstrap base built once (~4 min, kept under /var/tmp) and an overlay of
# it for each run (~1 s). Needs root (mount, chroot). Prints each stage's time.
# .ci/run runs `bookworm root quickstart`; the other combinations are run by
# hand before a change to the set-up lands (docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { sed -n '4,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
SUITE=$1; WHO=$2; WHAT=$3
case "$SUITE" in bookworm|trixie) ;; *) echo "fresh: SUITE is bookworm or trixie" >&2; exit 2 ;; esac
case "$WHAT" in quickstart|test) ;; *) echo "fresh: COMMAND is quickstart or test" >&2; exit 2 ;; esac
HARNESS=${FANSTORE_FRESH_HARNESS:-$(cd .. && pwd)/shared/fresh}
[ -x "$HARNESS/fresh-run.sh" ] || [ -f "$HARNESS/fresh-run.sh" ] \
  || { echo "fresh: no fresh-machine harness at $HARNESS (set FANSTORE_FRESH_HARNESS)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "fresh: needs root (mount, chroot)" >&2; exit 1; }

t0=$SECONDS
export FRESH_SUITE=$SUITE
if [ ! -e "/var/tmp/fresh-$SUITE-base/.fresh-base-ok" ]; then
  echo "== fresh: building the pristine $SUITE base (once, ~4 min)"
  bash "$HARNESS/build-base.sh"
  echo "== fresh: base built in $((SECONDS - t0)) s"
fi

envs=()
[ -n "${CI:-}" ] && envs+=(-e "CI=$CI")
case "$WHO" in
  root) CMD="bash scripts/$WHAT.sh" ;;
  user)
    # The administrator's part (as root): MPICH, libclang, a Rust toolchain
    # for every user (rustup's files under /opt, read-only to users). Then
    # the user's part, with no sudo: clone, then the command.
    CMD=$(cat <<'EOS'
set -euo pipefail
t=$SECONDS
apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mpich libmpich-dev libclang-dev pkg-config >/dev/null
cp -a /root/.rustup /opt/rustup; cp -a /root/.cargo/bin /opt/cargo-bin; chmod -R a+rX /opt/rustup /opt/cargo-bin
useradd -m -s /bin/bash alice
git clone -q /root/project /home/alice/fanstore; chown -R alice: /home/alice/fanstore
echo "== fresh: administrator's part took $((SECONDS - t)) s"
! sudo -u alice sudo -n true 2>/dev/null || { echo "fresh: alice can sudo"; exit 1; }
sudo -u alice -H env RUSTUP_HOME=/opt/rustup PATH=/opt/cargo-bin:/usr/local/bin:/usr/bin:/bin \
  ${CI:+CI=$CI} bash -c "cd ~/fanstore && bash scripts/$0.sh"
EOS
)
    CMD="bash -c $(printf '%q' "$CMD") $WHAT" ;;
  *) echo "fresh: WHO is root or user" >&2; exit 2 ;;
esac
echo "== fresh: $SUITE, $WHO, $WHAT"
rc=0
bash "$HARNESS/fresh-run.sh" --src=clone "${envs[@]}" . "$CMD" || rc=$?
echo "== fresh: $SUITE $WHO $WHAT: exit $rc after $((SECONDS - t0)) s"
exit $rc
