#!/usr/bin/env bash
# Re-splits FA4's wheels (.peers/p1 + .peers/p2, from ../shared/tools/fa4-wheels.sh) into four folders
# .peers/q1-q4 of < 29 MB each: the device tool carries 64 MiB per call, tracked files included (31 MB since the
# thirteenth session, when a 36-MB third of the old three-way split no longer fitted beside them).
# scripts/device_calls.sh verify / sanitize / stage / peers carry q1 / q2 / q3 / q4 (back to back: the machine
# keeps /tmp/fa4 only while warm) and rebuild the wheel on the device.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat .peers/p1/cu13part.aa .peers/p2/cu13part.ab > "$tmp/whl"
split -n 4 "$tmp/whl" "$tmp/cu13part."
rm -rf .peers/q1 .peers/q2 .peers/q3 .peers/q4; mkdir -p .peers/q1 .peers/q2 .peers/q3 .peers/q4
mv "$tmp/cu13part.aa" .peers/q1/; mv "$tmp/cu13part.ab" .peers/q2/; mv "$tmp/cu13part.ac" .peers/q3/
mv "$tmp/cu13part.ad" .peers/q4/
cp .peers/p2/WHEEL_NAME .peers/q4/
cp .peers/p1/apache_tvm_ffi* .peers/p1/nvidia_cutlass_dsl_libs_core* .peers/q3/
cp .peers/p1/nvidia_cutlass_dsl_libs_base* .peers/p1/torch_c* .peers/p1/quack* .peers/p1/flash_attn* \
   .peers/p1/nvidia_cutlass_dsl-4* .peers/q4/
du -sb .peers/q1 .peers/q2 .peers/q3 .peers/q4
