//! GPT-2's byte-level token spelling, shared by the Hugging Face
//! `tokenizer.json` and llama.cpp's `gpt2` tokenizer: every byte is written
//! as one printable character (a space as `Ġ`, a newline as `Ċ`), and a
//! token is the spelling of its bytes. A character vocabulary becomes a BPE
//! vocabulary with no merges: each ASCII character is its own token.

use crate::{Error, Result};

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes stand for
/// themselves, the others are shifted above 255.
pub fn byte_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| {
        (u32::from(b'!')..=u32::from(b'~')).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b)
    };
    let mut shifted = 0;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            shifted += 1;
            255 + shifted
        };
        table[b as usize] = char::from_u32(c).expect("below 512");
    }
    table
}

/// The byte-level spelling of each character of a character vocabulary,
/// in id order. Only single-byte (ASCII) characters have one: a character
/// of several UTF-8 bytes would need a token for each of its bytes, which
/// the model's vocabulary does not have.
pub fn char_tokens(chars: &[char]) -> Result<Vec<String>> {
    let table = byte_to_unicode();
    chars
        .iter()
        .map(|&c| {
            if c.is_ascii() {
                Ok(table[c as usize].to_string())
            } else {
                Err(Error::Config(format!(
                    "the vocabulary's character {c:?} is not ASCII: a byte-level tokenizer (GPT-2's, llama.cpp's) would need a token for each of its {} UTF-8 bytes, which the model's vocabulary does not have",
                    c.len_utf8()
                )))
            }
        })
        .collect()
}

/// A Hugging Face `tokenizer.json` for a character vocabulary: byte-level
/// BPE with no merges, so that `tokenizers` (and transformers'
/// `PreTrainedTokenizerFast`) split text into the same ids as taper.
pub fn char_tokenizer_json(chars: &[char]) -> Result<serde_json::Value> {
    let tokens = char_tokens(chars)?;
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i.into()))
        .collect();
    let byte_level = serde_json::json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
    });
    Ok(serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_gpt2s() {
        let t = byte_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xA0], 'ł');
        assert_eq!(t[0xAD], 'Ń');
        let mut all: Vec<char> = t.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn a_character_vocabulary_is_spelled_byte_by_byte() -> Result<()> {
        assert_eq!(char_tokens(&['\n', ' ', 'A'])?, ["Ċ", "Ġ", "A"]);
        let e = char_tokens(&['a', 'é']).unwrap_err().to_string();
        assert!(e.contains("'é' is not ASCII"), "{e}");
        // The tokenizers crate reads the JSON and splits as taper does.
        let json = char_tokenizer_json(&['\n', ' ', 'a', 'b'])?;
        let t: tokenizers::Tokenizer = serde_json::from_value(json).unwrap();
        let ids = t.encode("ab a\nb", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, [2, 3, 1, 2, 0, 3]);
        Ok(())
    }
}
