//! Whether a JPEG file holds its whole image. The JPEG decoder fills what a
//! truncated file lacks with grey and says nothing (browsers draw such files
//! too); Pillow refuses them ("image file is truncated"), and so does taper,
//! as it refuses a truncated PNG, naming the file and where its data ends.

/// Where the data of a JPEG file ends before its end-of-image marker (the
/// file's length), or None when the marker is there. Structure that is not
/// JPEG's is left to the decoder (None).
pub(super) fn truncated_at(b: &[u8]) -> Option<usize> {
    if !b.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let short = Some(b.len());
    let mut i = 2;
    loop {
        // A marker: 0xFF (and fill bytes), then its code.
        match b.get(i) {
            None => return short,
            Some(0xFF) => {}
            Some(_) => return None,
        }
        while b.get(i) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = b.get(i) else {
            return short;
        };
        i += 1;
        match code {
            0xD9 => return None,
            // Markers without a length: restarts, TEM.
            0xD0..=0xD7 | 0x01 => continue,
            _ => {}
        }
        let Some(len) = b.get(i..i + 2) else {
            return short;
        };
        let len = u16::from_be_bytes([len[0], len[1]]) as usize;
        if len < 2 {
            return None;
        }
        i += len;
        if code != 0xDA {
            continue;
        }
        // A scan's entropy-coded data runs to the next marker: 0xFF that
        // is neither a stuffed 0xFF 0x00 nor a restart marker.
        loop {
            let rest = b.get(i..).unwrap_or_default();
            let Some(k) = rest.iter().position(|&v| v == 0xFF) else {
                return short;
            };
            let mut j = i + k + 1;
            while b.get(j) == Some(&0xFF) {
                j += 1;
            }
            match b.get(j) {
                None => return short,
                Some(0x00 | 0xD0..=0xD7) => i = j + 1,
                Some(_) => {
                    i += k;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::truncated_at;

    fn jpeg(quality: u8) -> Vec<u8> {
        let img = image::RgbImage::from_fn(37, 29, |x, y| {
            image::Rgb([(x * 7) as u8, (y * 9) as u8, ((x * y) % 251) as u8])
        });
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
            .encode_image(&img)
            .unwrap();
        out
    }

    #[test]
    fn a_whole_jpeg_is_whole_and_every_cut_is_truncated() {
        for q in [20, 95] {
            let b = jpeg(q);
            assert_eq!(truncated_at(&b), None);
            // Data after the end-of-image marker (a camera's, or a motion
            // photo's video) is not the image's.
            let mut trailing = b.clone();
            trailing.extend_from_slice(&[0xFF, 0xDA, 0, 9, 1, 2, 3]);
            assert_eq!(truncated_at(&trailing), None);
            for cut in 2..b.len() {
                assert_eq!(
                    truncated_at(&b[..cut]),
                    Some(cut),
                    "cut at {cut} of {}",
                    b.len()
                );
            }
        }
        assert_eq!(truncated_at(b"\x89PNG"), None, "not a JPEG");
    }
}
