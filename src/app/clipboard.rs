//! Copy to the clipboard with OSC 52: the terminal sets its clipboard from an escape sequence,
//! which works over SSH and inside tmux (with `set-clipboard on`) without a display server.

use std::io::{self, Write};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (RFC 4648 §4).
pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The escape sequence that puts `text` on the system clipboard.
pub fn osc52(text: &str) -> String {
    // BEL-terminated: understood by more terminals than ST.
    format!("\x1b]52;c;{}\x07", base64(text.as_bytes()))
}

/// Writes the sequence to the terminal.
pub fn copy(out: &mut dyn Write, text: &str) -> io::Result<()> {
    out.write_all(osc52(text).as_bytes())?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        // RFC 4648 §10.
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc, "{plain:?}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn osc52_wraps_utf8_text() {
        assert_eq!(osc52("hé"), "\x1b]52;c;aMOp\x07");
        let mut out = Vec::new();
        copy(&mut out, "foo").unwrap();
        assert_eq!(out, b"\x1b]52;c;Zm9v\x07");
    }
}
