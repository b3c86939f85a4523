#!/usr/bin/env bash
# An emulated 64-bit ARM board for tests and benchmarks: an arm64 Debian root run through QEMU
# user-mode emulation, with Python, the aarch64 apache-tvm wheel and an aarch64 libtvm_hetero,
# serving TVM RPC on 127.0.0.1.
#
#   scripts/board.sh setup    prepare (or refresh) the cached root; needs root for debootstrap/binfmt
#   scripts/board.sh start    setup if needed, then start the RPC server (prints host:port)
#   scripts/board.sh stop     stop the server, unmount /proc and /dev from the root
#   scripts/board.sh status   running or not
#
# The prepared root is cached in $TVM_HETERO_BOARD_DIR (default ~/.cache/tvm-hetero/board): the first
# setup takes minutes (debootstrap, pip under emulation), later ones only rebuild libtvm_hetero.
# Tests and benchmarks find the running board through $TVM_HETERO_BOARD_DIR/server (host:port).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
dir="${TVM_HETERO_BOARD_DIR:-$HOME/.cache/tvm-hetero/board}"
port="${TVM_HETERO_BOARD_PORT:-9190}"
root="$dir/root"
tvm_version="0.27.0.post1"
# What the board's server imports: TVM, and what tvm.rpc's server process pool needs.
board_requirements="apache-tvm==$tvm_version cloudpickle==3.1.2 psutil==7.2.2"
py_version="3.11"  # Debian bookworm's python3, inside the root
host_py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$host_py" ] || host_py=/work/main/.venv/bin/python
[ -x "$host_py" ] || host_py=python3

say() { echo "board: $*"; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "board: $1 needs root (debootstrap, binfmt_misc, bind mounts)" >&2
    exit 1
  fi
}

install_host_packages() {
  local missing=()
  for pair in debootstrap:debootstrap qemu-aarch64-static:qemu-user-static update-binfmts:binfmt-support \
              aarch64-linux-gnu-g++:g++-aarch64-linux-gnu; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# The kernel runs aarch64 programs through qemu once binfmt_misc knows the interpreter.
register_binfmt() {
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
}

make_root() {
  [ -f "$root/.tvm-hetero-root" ] && return
  say "debootstrap arm64 bookworm into $root (4 to 6 minutes)"
  rm -rf "$dir/root.partial"
  mkdir -p "$dir"
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-pip bookworm \
    "$dir/root.partial" http://deb.debian.org/debian >"$dir/debootstrap.log" 2>&1 ||
    { tail -20 "$dir/debootstrap.log" >&2; exit 1; }
  rm -rf "$root"
  mv "$dir/root.partial" "$root"
  touch "$root/.tvm-hetero-root"
}

# The host's pip (which has this machine's registry configuration) fetches the aarch64 wheels; the
# root installs them from files, so it needs neither network access nor a pip configuration.
download_wheels() {
  [ "$(cat "$dir/wheels/.complete" 2>/dev/null)" = "$board_requirements" ] && return
  say "downloading the aarch64 wheels: $board_requirements"
  mkdir -p "$dir/wheels"
  # shellcheck disable=SC2086  # one word per requirement
  "$host_py" -m pip download -q $board_requirements --platform manylinux_2_28_aarch64 \
    --only-binary=:all: --python-version "$py_version" -d "$dir/wheels" 2>&1 | grep -v "^WARNING: Location" || true
  ls "$dir"/wheels/apache_tvm-"$tvm_version"-*.whl >/dev/null
  rm -rf "$dir/wheel-root" && mkdir -p "$dir/wheel-root"
  for wheel in "$dir"/wheels/apache_tvm-*.whl "$dir"/wheels/apache_tvm_ffi-*.whl; do
    "$host_py" -m zipfile -e "$wheel" "$dir/wheel-root"
  done
  echo "$board_requirements" >"$dir/wheels/.complete"
}

make_venv() {
  [ "$(cat "$root/opt/venv/.complete" 2>/dev/null)" = "$board_requirements" ] && return
  say "installing $board_requirements in the board's venv (1 to 3 minutes under emulation)"
  rm -rf "$root/opt/wheels"
  mkdir -p "$root/opt/wheels"
  cp "$dir"/wheels/*.whl "$root/opt/wheels/"
  [ -x "$root/opt/venv/bin/python" ] || chroot "$root" /usr/bin/python3 -m venv /opt/venv
  # shellcheck disable=SC2086
  chroot "$root" /opt/venv/bin/pip install -q --no-index --find-links /opt/wheels $board_requirements
  echo "$board_requirements" >"$root/opt/venv/.complete"
}

# libtvm_hetero for aarch64, cross-compiled against the aarch64 wheel's headers and libraries.
build_board_library() {
  say "cross-compiling libtvm_hetero for aarch64"
  cmake -S "$repo" -B "$repo/build-aarch64" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$repo/cmake/aarch64-linux-gnu.cmake" \
    -DTVM_WHEEL_ROOT="$dir/wheel-root" -DTVM_HETERO_WITH_ONEDNN=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$repo/build-aarch64" --target tvm_hetero >/dev/null
  mkdir -p "$root/opt/tvm-hetero"
  # A fresh inode: a running server may have the old file mapped.
  cp "$repo/build-aarch64/libtvm_hetero.so" "$root/opt/tvm-hetero/libtvm_hetero.so.new"
  mv "$root/opt/tvm-hetero/libtvm_hetero.so.new" "$root/opt/tvm-hetero/libtvm_hetero.so"
}

setup() {
  need_root setup
  install_host_packages
  register_binfmt
  make_root
  download_wheels
  make_venv
  build_board_library
  say "ready: $root"
}

mount_binds() {
  for fs in proc dev; do
    mountpoint -q "$root/$fs" || mount --bind "/$fs" "$root/$fs"
  done
}

unmount_binds() {
  for fs in dev proc; do
    if mountpoint -q "$root/$fs"; then umount -l "$root/$fs"; fi
  done
}

running() {
  [ -f "$dir/server.pid" ] && kill -0 "$(cat "$dir/server.pid")" 2>/dev/null
}

start() {
  if running; then
    say "already running on $(cat "$dir/server")"
    return
  fi
  setup
  mount_binds
  local site="/opt/venv/lib/python$py_version/site-packages"
  say "starting the RPC server on 127.0.0.1:$port (importing tvm under emulation takes ~15 s)"
  # setsid: the server forks a worker per session; stop ends the whole group.
  setsid env LD_LIBRARY_PATH="$site/tvm/lib:$site/tvm_ffi/lib" TVM_NUM_THREADS="${TVM_HETERO_BOARD_THREADS:-1}" \
    chroot "$root" /opt/venv/bin/python -m tvm.exec.rpc_server --host 127.0.0.1 --port "$port" \
    --port-end "$((port + 1))" --load-library /opt/tvm-hetero/libtvm_hetero.so >"$dir/server.log" 2>&1 &
  echo $! >"$dir/server.pid"
  for _ in $(seq 1 240); do
    if ! running; then
      tail -20 "$dir/server.log" >&2
      exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "127.0.0.1:$port" >"$dir/server"
      say "running on 127.0.0.1:$port (log: $dir/server.log)"
      return
    fi
    sleep 0.5
  done
  echo "board: the server did not listen within 120 s; log: $dir/server.log" >&2
  stop
  exit 1
}

stop() {
  if running; then
    kill -- "-$(cat "$dir/server.pid")" 2>/dev/null || true
    sleep 0.5
    kill -9 -- "-$(cat "$dir/server.pid")" 2>/dev/null || true
  fi
  rm -f "$dir/server.pid" "$dir/server"
  [ -d "$root" ] && unmount_binds
  say "stopped"
}

status() {
  if running; then
    say "running on $(cat "$dir/server") (root $root)"
  else
    say "not running (root $([ -f "$root/.tvm-hetero-root" ] && echo prepared || echo "not prepared") at $root)"
    return 3
  fi
}

case "${1:-}" in
  setup) setup ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: scripts/board.sh setup|start|stop|status" >&2; exit 2 ;;
esac
