"""Writing sampled clips: a side-by-side layout with captions, an animated GIF (Pillow), an MP4 (imageio with
imageio-ffmpeg's H.264 encoder) and a PNG strip of frames (Pillow).

Frames are ``uint8`` NumPy arrays ``(frames, height, width, 3)``; :func:`to_frames` makes them from a
model's ``(3, frames, H, W)`` clip in ``[0, 1]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

GAP = 4  # pixels between tiles
BACKGROUND = (255, 255, 255)
CAPTION_HEIGHT = 22


def to_frames(clip) -> np.ndarray:
    """``(3, F, H, W)`` float tensor or array in ``[0, 1]`` -> ``(F, H, W, 3)`` uint8."""
    a = clip.detach().float().cpu().numpy() if hasattr(clip, "detach") else np.asarray(clip, dtype=np.float32)
    return (np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8).transpose(1, 2, 3, 0)


def upscale(frames: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour enlargement of ``(F, H, W, 3)`` frames by an integer ``factor``."""
    if factor == 1:
        return frames
    return frames.repeat(factor, axis=1).repeat(factor, axis=2)


def tile(videos, cols: int, gap: int = GAP) -> np.ndarray:
    """Clips of equal shape ``(F, H, W, 3)`` laid out ``cols`` to a row, ``gap`` white pixels between them."""
    videos = list(videos)
    f, h, w, _ = videos[0].shape
    rows = -(-len(videos) // cols)
    out = np.full((f, rows * h + (rows - 1) * gap, cols * w + (cols - 1) * gap, 3), 255, np.uint8)
    for i, v in enumerate(videos):
        r, c = divmod(i, cols)
        out[:, r * (h + gap) : r * (h + gap) + h, c * (w + gap) : c * (w + gap) + w] = v
    return out


def _font(size: int = 14):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1: a scalable font when FreeType is there
    except TypeError:
        return ImageFont.load_default()


def caption_bar(width: int, captions, height: int = CAPTION_HEIGHT) -> np.ndarray:
    """A white ``(height, width, 3)`` bar with ``captions`` ``[(x_center, text), ...]`` in black."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(img)
    font = _font()
    for x, text in captions:
        box = draw.textbbox((0, 0), text, font=font)
        draw.text(
            (x - (box[2] - box[0]) / 2, (height - (box[3] - box[1])) / 2 - box[1]), text, fill=(0, 0, 0), font=font
        )
    return np.asarray(img)


def side_by_side(left: np.ndarray, right: np.ndarray, labels=("attnclimb", "torch SDPA"), gap: int = 12) -> np.ndarray:
    """``left`` and ``right`` (``(F, H, W, 3)`` each) next to each other under a caption bar with ``labels``."""
    f, h, w, _ = left.shape
    if right.shape != left.shape:
        raise ValueError(f"the two sides differ in shape: {left.shape} vs {right.shape}")
    width = 2 * w + gap
    body = np.full((f, h, width, 3), 255, np.uint8)
    body[:, :, :w], body[:, :, w + gap :] = left, right
    bar = caption_bar(width, [(w / 2, labels[0]), (w + gap + w / 2, labels[1])])
    return np.concatenate([np.broadcast_to(bar, (f, *bar.shape)), body], axis=1)


def pad_to(frames: np.ndarray, multiple: int = 16) -> np.ndarray:
    """Pad height and width with white up to a multiple of ``multiple`` (what H.264's 4:2:0 macroblocks want)."""
    _, h, w, _ = frames.shape
    ph, pw = -h % multiple, -w % multiple
    if not ph and not pw:
        return frames
    return np.pad(frames, ((0, 0), (0, ph), (0, pw), (0, 0)), constant_values=255)


def write_gif(frames: np.ndarray, path, fps: float = 8) -> Path:
    """An endlessly looping GIF of ``frames`` (Pillow; each frame quantised to 256 colours). Pillow merges
    consecutive identical frames into one longer frame."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(fr) for fr in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0, optimize=False)
    return path


def write_mp4(frames: np.ndarray, path, fps: float = 8) -> Path:
    """An H.264 MP4 of ``frames`` (padded to multiples of 16) through imageio and imageio-ffmpeg.

    Raises:
        RuntimeError: imageio or imageio-ffmpeg is not installed (``pip install 'attnclimb[video]'``).
    """
    try:
        import imageio.v2 as iio
        import imageio_ffmpeg  # noqa: F401  (the encoder binary imageio's ffmpeg plugin runs)
    except ImportError as exc:
        raise RuntimeError(
            f"writing MP4 needs imageio and imageio-ffmpeg (pip install 'attnclimb[video]'): {exc}"
        ) from exc
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = pad_to(frames)
    writer = iio.get_writer(
        str(path),
        format="FFMPEG",
        mode="I",
        fps=fps,
        codec="libx264",
        quality=8,
        pixelformat="yuv420p",
        macro_block_size=16,
        ffmpeg_log_level="error",
    )
    try:
        for fr in frames:
            writer.append_data(fr)
    finally:
        writer.close()
    return path


def write_strip(rows, path, every: int = 2, max_cols: int = 8, gap: int = GAP, label_width: int = 90) -> Path:
    """A PNG with one row of frames per ``(label, frames)`` in ``rows``: frames 0, ``every``, 2·``every``, …
    (at most ``max_cols``), the label at the left of each row and the frame numbers on top."""
    from PIL import Image, ImageDraw

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f, h, w, _ = rows[0][1].shape
    picks = list(range(0, f, max(1, every)))[:max_cols]
    width = label_width + len(picks) * (w + gap)
    height = CAPTION_HEIGHT + len(rows) * (h + gap)
    img = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(img)
    font = _font(13)
    for j, k in enumerate(picks):
        draw.text((label_width + j * (w + gap) + 2, 4), f"frame {k}", fill=(0, 0, 0), font=font)
    for i, (label, frames) in enumerate(rows):
        y = CAPTION_HEIGHT + i * (h + gap)
        draw.text((4, y + h / 2 - 7), label, fill=(0, 0, 0), font=font)
        for j, k in enumerate(picks):
            img.paste(Image.fromarray(frames[k]), (label_width + j * (w + gap), y))
    img.save(path)
    return path
