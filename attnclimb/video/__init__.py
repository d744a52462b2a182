"""Part 2 of the capstone (issue 10): a small video diffusion transformer with 128-wide attention heads,
trained by rectified flow on clips the package draws itself, and sampled with attnclimb and with torch's
SDPA from the same noise.

``python -m attnclimb video train | sample | clips`` (:mod:`attnclimb.video.cli`); ``docs/capstone.md``.
Modules: :mod:`~attnclimb.video.clips` (the clip generator), :mod:`~attnclimb.video.model` (the model),
:mod:`~attnclimb.video.flow` (objective and sampler), :mod:`~attnclimb.video.train` (training, weights
file), :mod:`~attnclimb.video.sample` (the two samplings, PSNR), :mod:`~attnclimb.video.writers` (GIF,
MP4, PNG). Importing this package imports neither torch nor NumPy.
"""
