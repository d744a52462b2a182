#!/usr/bin/env bash
# Downloads what `python -m attnclimb capstone` and `python -m attnclimb video` need on the GPU machine and its
# image lacks, as wheels for CPython 3.12 on x86-64 Linux, into .peers/video (ignored by git; < 64 MiB, so one
# device call carries it): diffusers and its pure-Python dependencies, and imageio-ffmpeg (an ffmpeg binary
# for the MP4 writer). The image already has torch, numpy, pillow, safetensors, regex, requests, filelock,
# huggingface-hub, accelerate and imageio (the device notes' package list); wheels of some pure-Python ones
# are staged too, so that pip finds them if the image's versions do not satisfy diffusers.
# Run from the project root:   bash scripts/stage_video_wheels.sh
# It prints the device-side install command; docs/capstone.md has the whole GPU session.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.peers/video
grep -qx '/.peers/' .git/info/exclude 2>/dev/null || grep -qx '/.peers/' .gitignore \
  || echo '/.peers/' >> "$(git rev-parse --git-path info/exclude)"
# diffusers 0.42.1: the release the CPU tests ran against and the issue measured. importlib-metadata 8.7
# needs only zipp (10.x also needs lazy-importer). accelerate (for --weights) is on the image: not staged,
# since pip would then re-check torch's own requirements.
pure=(
  diffusers==0.42.1
  importlib-metadata==8.7.0
  zipp==4.1.2
  huggingface-hub==1.33.0
  filelock==4.3.1
  imageio==2.38.1
)
# 0.6.0: its wheel (29 MB, ffmpeg 7) leaves room under the limit; 0.8's is 68 MB. The writer's API is the same.
binary=(imageio-ffmpeg==0.6.0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "${pure[@]}"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux2010_x86_64 --platform manylinux1_x86_64 -d "$tmp" "${binary[@]}"
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp"/*.whl "$dest/"
size=$(du -sb "$dest" | cut -f1)
ls -l "$dest"
echo "$dest: $((size / 1048576)) MiB"
if [ "$size" -ge $((60 * 1048576)) ]; then
  echo "$dest is over 60 MiB: it will not travel in one device call with the working tree" >&2
  exit 1
fi
cat <<'MSG'
On the device (carry .peers/video), before the capstone or video commands:
  python3 -m pip install -q --no-index --find-links .peers/video diffusers imageio-ffmpeg imageio
(pip takes what the image has where it satisfies diffusers' requirements and the staged wheels otherwise.)
MSG
