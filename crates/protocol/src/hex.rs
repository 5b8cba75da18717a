//! Lowercase hexadecimal, the way digests, cache keys and derived ids are written.

/// The sixteen digits.
pub const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two digits of a byte.
pub fn byte(b: u8) -> [u8; 2] {
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]]
}

/// Appends `bytes` to `out`, two digits a byte.
pub fn push(out: &mut String, bytes: &[u8]) {
    out.reserve(2 * bytes.len());
    for &b in bytes {
        let [high, low] = byte(b);
        out.push(char::from(high));
        out.push(char::from(low));
    }
}

/// `bytes`, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    push(&mut out, bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_written_as_two_lowercase_digits() {
        assert_eq!(encode(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        let mut id = String::from("mcp_");
        push(&mut id, &[0x12, 0xab]);
        assert_eq!(id, "mcp_12ab");
        assert_eq!(byte(0x7c), *b"7c");
    }
}
