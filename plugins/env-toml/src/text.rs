//! Variable names this plugin accepts and how values are echoed in logs.

/// Longest variable name accepted, in bytes (NCCL's longest is under 40).
pub const MAX_NAME_BYTES: usize = 128;
/// Characters of a value shown in a log line or error before it is cut.
pub const ECHO_CHARS: usize = 80;

/// Why `name` is not an NCCL variable name, or `None` if it is one:
/// `NCCL_` followed by upper-case ASCII letters, digits and `_`.
pub fn name_problem(name: &str) -> Option<String> {
    let shown = cut(name);
    if name.len() > MAX_NAME_BYTES {
        return Some(format!(
            "`{shown}` is {} bytes long; names are at most {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    let Some(rest) = name.strip_prefix("NCCL_") else {
        return Some(format!(
            "`{shown}` is not an NCCL variable: only NCCL_* names are accepted"
        ));
    };
    if rest.is_empty()
        || !rest
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    {
        return Some(format!(
            "`{shown}` is not an NCCL variable name (NCCL_ then A-Z, 0-9 and _ only)"
        ));
    }
    None
}

/// `text` cut to [`ECHO_CHARS`] characters (with `…` when cut) and with control
/// characters escaped, so a hostile value cannot flood or forge log lines.
pub fn cut(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == ECHO_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name_problem("NCCL_SOCKET_IFNAME"), None);
        assert_eq!(name_problem("NCCL_P2P_LEVEL2"), None);
        for bad in [
            "NCCL_",
            "nccl_debug",
            "NCCL_debug",
            "CUDA_VISIBLE_DEVICES",
            "NCCL-X",
            "",
        ] {
            assert!(name_problem(bad).is_some(), "{bad}");
        }
        let long = format!("NCCL_{}", "A".repeat(MAX_NAME_BYTES));
        assert!(
            name_problem(&long)
                .expect("too long")
                .contains("bytes long")
        );
    }

    #[test]
    fn cut_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(cut("eth0"), "eth0");
        let exact = "é".repeat(ECHO_CHARS);
        assert_eq!(cut(&exact), exact);
        let long = "日".repeat(ECHO_CHARS + 3);
        let shown = cut(&long);
        assert_eq!(shown.chars().count(), ECHO_CHARS + 1);
        assert!(shown.ends_with('…'));
        assert_eq!(cut("a\nb\u{1b}"), "a\\nb\\u{1b}");
    }
}
