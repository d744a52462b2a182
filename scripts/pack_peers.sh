#!/usr/bin/env bash
# FA4's wheels (.peers/p1 + .peers/p2, from ../shared/tools/fa4-wheels.sh) installed here with pip --target for the
# device's Python (3.12, manylinux_2_28 x86_64) and packed as one tar.xz, split into two halves .peers/x1, .peers/x2
# (~34 MB each: xz packs the 92-MB libs-cu13 wheel's shared objects far tighter than the wheel's zip does, 98 MB of
# wheels -> 69 MB). Two calls carry FA4 instead of four (.peers/q1-q4 of split_peers.sh): the device tool takes
# 64 MiB per call, the tracked tree (31 MB) included. device_calls.sh `stage x1` and then any mode that installs FA4
# with .peers/x2 carried (peers, peers-bench, diag) unpack it into /tmp/site; no pip runs on the device.
# Takes ~3 min (xz -9e on 275 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat .peers/p1/cu13part.aa .peers/p2/cu13part.ab > "$tmp/$(cat .peers/p2/WHEEL_NAME)"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$tmp/site" --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --only-binary=:all: "$tmp"/*.whl .peers/p1/*.whl
tar -C "$tmp/site" -cf - . | xz -9e -T0 > "$tmp/fa4site.tar.xz"
split -n 2 "$tmp/fa4site.tar.xz" "$tmp/fa4site.tar.xz."
(cd "$tmp" && sha256sum fa4site.tar.xz.aa fa4site.tar.xz.ab > SHA256SUMS)   # checked on the device before unpacking
rm -rf .peers/x1 .peers/x2; mkdir -p .peers/x1 .peers/x2
mv "$tmp/fa4site.tar.xz.aa" .peers/x1/; mv "$tmp/fa4site.tar.xz.ab" "$tmp/SHA256SUMS" .peers/x2/
du -sb .peers/x1 .peers/x2
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1); half=$(du -sb .peers/x2 | cut -f1)
echo "tracked tree $tree B + one half $half B = $((tree + half)) B of the 67108864 B a call carries"
[ $((tree + half)) -lt 67108864 ] || { echo "pack_peers: too big for one call; split in three"; exit 1; }
