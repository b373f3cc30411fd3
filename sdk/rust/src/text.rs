//! Text cut to a size for messages and events (at a character boundary, marked with `…`).

/// `text` if it is at most `max_bytes` long, else its first `max_bytes` or fewer bytes (at a
/// character boundary) followed by `…`.
pub fn truncate(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    format!("{}…", &text[..text.floor_char_boundary(max_bytes)])
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn cuts_at_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdef", 3), "abc…");
        assert_eq!(truncate("ééé", 3), "é…", "é is two bytes: the cut moves back");
    }
}
