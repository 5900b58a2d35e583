"""Issue 26: images decoded faithfully. A 16-bit PNG, an EXIF-rotated file, a palette, an opaque alpha channel
and a CMYK JPEG of a training image each decode to that image's pixels (so a forget image is matched to it),
or end in one error line naming the file and the fix; a lossy copy is refused or matched as the user says;
links out of the given folder are refused."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data import TTPDataModule
from ttp_lightning.data.images import Preprocess, decode, finish, read_file
from ttp_lightning.data.sources import ImageFolderSource

ORIENTATION = 0x0112
GREY = Preprocess(channels=1, image_size=16)


def _digit(seed: int) -> np.ndarray:
    """A 16x16 grey image with strokes and flat background, like a digit."""
    rng = np.random.default_rng(seed)
    image = np.zeros((16, 16), np.uint8)
    for _ in range(4):
        r, c = rng.integers(1, 13, 2)
        image[r:r + 3, c:c + rng.integers(2, 5)] = rng.integers(120, 256)
    return image


def _folder(tmp_path, count: int = 6):
    """An image folder of 8-bit grey PNGs (train/<class>/, test/<class>/) and {training index: pixels}."""
    pixels = {}
    for split, offset in (("train", 0), ("test", 100)):
        for i in range(count):
            label = str(i % 2)
            path = tmp_path / "data" / split / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(_digit(offset + i)).save(path)
            if split == "train":
                pixels[(label, f"{i}.png")] = _digit(i)
    return tmp_path / "data", [pixels[key] for key in sorted(pixels)]  # class folders, then files, sorted


def _datamodule(root, forget, **forget_settings) -> TTPDataModule:
    dm = TTPDataModule(name="imagefolder", loader=ImageFolderSource(), root=str(root), normalize=False,
                       forget={"size": None, "images": str(forget), **forget_settings})
    dm.setup()
    return dm


def _decoded(image: Image.Image) -> np.ndarray:
    return decode(image, "x.png", "image").pixels[:, :, 0]


def test_sixteen_bit_palette_alpha_cmyk_and_equal_channels_decode_to_the_8_bit_pixels():
    grey = _digit(1)
    assert np.array_equal(_decoded(Image.fromarray(grey.astype(np.uint16) * 257)), grey)  # I;16, v * 257
    palette = Image.fromarray(grey).convert("P")
    assert palette.mode == "P" and np.array_equal(_decoded(palette), grey)  # a grey palette is grey
    assert np.array_equal(_decoded(Image.fromarray(grey).convert("LA")), grey)  # opaque alpha dropped
    rgb = decode(Image.fromarray(grey).convert("RGB"), "x.png", "image")
    assert rgb.channels == 3  # an RGB file is colour data (a provider's RGB model takes it as RGB) ...
    assert torch.equal(finish(rgb, "x.png", GREY, "image")[0], torch.as_tensor(grey))  # ... and grey data exactly
    cmyk = io.BytesIO()
    Image.fromarray(np.stack([grey] * 3, axis=2)).convert("CMYK").save(cmyk, "JPEG", quality=100)
    decoded = decode(Image.open(cmyk), "x.jpg", "image")
    assert "CMYK converted to RGB (Pillow)" in decoded.notes and decoded.channels == 3


def _transparent() -> Image.Image:
    image = Image.fromarray(_digit(0)).convert("LA")
    image.putpixel((0, 0), (100, 0))
    return image


@pytest.mark.parametrize("make, words", [
    (_transparent, "1 transparent pixels"),  # what a model would see there is not defined
    (lambda: Image.fromarray(np.arange(16, dtype=np.uint16).reshape(4, 4) * 10), "8-bit values in a 16-bit file"),
    (lambda: Image.fromarray(np.zeros((4, 4), np.float32)), "floating-point pixels"),
])
def test_what_has_no_faithful_decoding_is_one_line_naming_the_file(make, words):
    with pytest.raises(TTPUserError, match=words) as caught:
        decode(make(), "sent/face.png", "forget image")
    assert "sent/face.png" in str(caught.value) and "\n" not in str(caught.value)


def test_a_colour_photo_for_grey_data_is_refused_and_grey_is_repeated_for_colour_data(tmp_path):
    colour = np.random.default_rng(0).integers(0, 256, (16, 16, 3)).astype(np.uint8)
    Image.fromarray(colour).save(tmp_path / "c.png")
    Image.fromarray(_digit(0)).save(tmp_path / "g.png")
    with pytest.raises(TTPUserError, match="is a colour image; the data has 1 channel"):
        read_file(tmp_path / "c.png", GREY, "forget image")
    pixels, _ = read_file(tmp_path / "g.png", Preprocess(3, 16), "forget image")
    assert pixels.shape == (3, 16, 16) and all(torch.equal(pixels[i], torch.as_tensor(_digit(0))) for i in range(3))


def test_a_16_bit_png_and_an_exif_rotated_png_of_training_images_are_matched_to_them(tmp_path):
    root, train = _folder(tmp_path)
    forget = tmp_path / "forget" / "0"
    forget.mkdir(parents=True)
    Image.fromarray(train[0].astype(np.uint16) * 257).save(forget / "sixteen.png")
    exif = Image.Exif()
    exif[ORIENTATION] = 6  # "rotate 90 clockwise to view": the stored pixels are the image turned the other way
    Image.fromarray(np.rot90(train[2], k=1).copy()).save(forget / "rotated.png", exif=exif.tobytes())
    dm = _datamodule(root, tmp_path / "forget")
    records = {tuple(r["decoded"]): r for r in dm.forget_images}
    assert records[("16-bit grey scaled to 8 bits (top byte)",)]["training_indices"] == [0]
    assert records[("EXIF orientation 6 applied",)]["training_indices"] == [2]
    assert not any(r["outside"] for r in dm.forget_images)


def test_an_exif_rotated_jpeg_of_a_training_image_is_refused_in_one_line_or_matched_when_asked(tmp_path):
    root, train = _folder(tmp_path)
    forget = tmp_path / "forget" / "1"
    forget.mkdir(parents=True)
    exif = Image.Exif()
    exif[ORIENTATION] = 8
    Image.fromarray(np.rot90(train[4], k=-1).copy()).save(forget / "photo.jpg", quality=90, exif=exif.tobytes())
    with pytest.raises(TTPUserError, match=r"is no training image bit for bit, but training image "
                                           r"'train/1/3.png' \(index 4\) differs") as caught:
        _datamodule(root, tmp_path / "forget")
    message = str(caught.value)
    assert "near_copies=match" in message and "\n" not in message and "NEAR_COPY" not in message
    assert "(a near copy: under 8/255)" in message  # the rule in words, not a constant's name
    matched = _datamodule(root, tmp_path / "forget", near_copies="match").forget_images[0]
    assert matched["training_indices"] == [4] and matched["near_copy_of"] == 4 and not matched["outside"]
    assert _datamodule(root, tmp_path / "forget", near_copies="outside").forget_images[0]["outside"]


def test_links_out_of_the_given_folder_are_refused(tmp_path):
    root, _ = _folder(tmp_path)
    forget = tmp_path / "forget"
    forget.mkdir()
    (forget / "1").symlink_to(root / "train" / "1", target_is_directory=True)  # "forget every 1 we trained on"
    with pytest.raises(TTPUserError, match="links to .*outside"):
        _datamodule(root, forget)
    (forget / "1").unlink()
    (forget / "0").mkdir()
    (forget / "0" / "face.png").symlink_to(root / "train" / "0" / "0.png")
    with pytest.raises(TTPUserError, match="links to .*outside"):
        _datamodule(root, forget)


@pytest.mark.parametrize("text, match", [
    ("\ufefffile,label\nface.png,1\n", None),  # a spreadsheet's byte-order mark: read, not "needs header"
    ("file,label\n\"face.png\",\"1\"\n", None),
    ("file,label\nface.png\n", "row 2 has no label"),
    ("file,label\nface.png,1\nface.png,1\n", "names 'face.png' twice \\(rows 2 and 3\\)"),
    ("file,label\n\"face\n.png\",1\n", "names 'face\\\\n.png', which is not a file inside"),
])
def test_labels_csv_variants_are_read_or_refused_in_one_line(tmp_path, text, match):
    from ttp_lightning.data.images import read_forget_images

    forget = tmp_path / "forget"
    forget.mkdir()
    Image.fromarray(_digit(0)).save(forget / "face.png")
    (forget / "labels.csv").write_text(text, encoding="utf-8")
    if match is None:
        found = read_forget_images(forget, GREY, ("0", "1"))
        assert found.labels.tolist() == [1]
        return
    with pytest.raises(TTPUserError, match=match) as caught:
        read_forget_images(forget, GREY, ("0", "1"))
    assert "\n" not in str(caught.value)


def test_an_animated_png_is_refused_not_read_at_its_first_frame(tmp_path):
    """Issue 59, minor: an APNG was checked on its first frame only, while a viewer may show another."""
    frames = [Image.fromarray(_digit(seed)) for seed in (1, 2)]
    path = tmp_path / "face.png"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert Image.open(path).n_frames == 2
    with pytest.raises(TTPUserError, match="is an animated image of 2 frames") as caught:
        read_file(path, GREY, "forget image")
    assert "\n" not in str(caught.value)
    frames[0].save(tmp_path / "still.png")
    assert read_file(tmp_path / "still.png", GREY, "forget image")[0].shape == (1, 16, 16)
