"""An image folder and what torchvision's ImageFolder makes of it, for
tests/interop.rs: `python image_folder.py ROOT HEIGHT WIDTH` writes images
with Pillow (PNG in RGB, grey and RGBA, JPEG, BMP, TIFF plain and LZW, of several sizes; a nested
folder; a file that is not an image), then prints one JSON line: the classes,
and for each sample its path, label and pixels as
`Compose([Resize((HEIGHT, WIDTH)), ToTensor()])` gives them (RGB), and with
`Grayscale()` after the resize. torchvision itself is not installed (its
wheel pins another torch), so `find_classes` and `make_dataset` are its code,
and the transforms are the Pillow calls it makes: `img.resize((w, h),
BILINEAR)`, `img.convert("L")`, and bytes / 255 channel first.
"""

import json
import os
import sys

from PIL import Image

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_classes(directory):
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    return classes, {name: i for i, name in enumerate(classes)}


def make_dataset(directory, class_to_idx):
    instances = []
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if path.lower().endswith(IMG_EXTENSIONS):
                    instances.append((path, class_index))
    return instances


def pattern(w, h, mode, seed):
    """An image with smooth and sharp detail, so that resizing shows."""
    img = Image.new("RGB", (w, h))
    img.putdata([
        ((x * 37 + y * 11 + seed * 50) % 256, (x * y + seed * 7) % 256, ((x ^ y) * 9 + seed) % 256)
        for y in range(h) for x in range(w)
    ])
    return img.convert(mode)


def write(root):
    files = [
        ("Zebra/a.png", 20, 24, "RGB"),
        ("cat/10.png", 31, 17, "L"),
        ("cat/2.jpg", 40, 33, "RGB"),
        ("cat/sub/0.bmp", 16, 16, "RGB"),
        ("cat/sub/1.PNG", 12, 20, "RGBA"),
        ("dog/x.jpeg", 64, 48, "RGB"),
        ("dog/y.png", 9, 30, "RGB"),
        ("dog/z.tif", 18, 14, "RGB"),
        ("dog/z2.tiff", 15, 11, "L"),
    ]
    for i, (name, w, h, mode) in enumerate(files):
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        img = pattern(w, h, mode, i)
        if name.endswith((".jpg", ".jpeg")):
            img.save(path, quality=95)
        elif name.endswith(".tif"):
            img.save(path, compression="tiff_lzw")
        else:
            img.save(path)
    with open(os.path.join(root, "dog", "notes.txt"), "w") as f:
        f.write("not an image\n")


def pixels(img, channels):
    """ToTensor: channel first, bytes / 255."""
    data = list(img.getdata())
    if channels == 1:
        return [v / 255 for v in data]
    return [px[c] / 255 for c in range(3) for px in data]


def main():
    root, h, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    write(root)
    classes, class_to_idx = find_classes(root)
    samples = []
    for path, label in make_dataset(root, class_to_idx):
        img = Image.open(path).convert("RGB").resize((w, h), Image.BILINEAR)
        samples.append({
            "path": os.path.relpath(path, root),
            "label": label,
            "rgb": pixels(img, 3),
            "grey": pixels(img.convert("L"), 1),
        })
    print(json.dumps({"classes": classes, "samples": samples}))


if __name__ == "__main__":
    main()
