#!/usr/bin/env bash
# Re-splits FA4's wheels (.peers/p1 + .peers/p2, from ../shared/tools/fa4-wheels.sh) into three folders
# .peers/q1-q3 of < 36 MB each: the device tool carries 64 MiB per call, tracked files included (23 MB).
# scripts/device_calls.sh verify / sanitize / peers carry q1 / q2 / q3 and rebuild the wheel on the device.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat .peers/p1/cu13part.aa .peers/p2/cu13part.ab > "$tmp/whl"
split -b 30700000 "$tmp/whl" "$tmp/cu13part."
rm -rf .peers/q1 .peers/q2 .peers/q3; mkdir -p .peers/q1 .peers/q2 .peers/q3
mv "$tmp/cu13part.aa" .peers/q1/; mv "$tmp/cu13part.ab" .peers/q2/; mv "$tmp/cu13part.ac" .peers/q3/
cp .peers/p2/WHEEL_NAME .peers/q3/
cp .peers/p1/apache_tvm_ffi* .peers/p1/nvidia_cutlass_dsl_libs_core* .peers/q1/
cp .peers/p1/nvidia_cutlass_dsl_libs_base* .peers/p1/torch_c* .peers/p1/quack* .peers/p1/flash_attn* \
   .peers/p1/nvidia_cutlass_dsl-4* .peers/q2/
du -sb .peers/q1 .peers/q2 .peers/q3
