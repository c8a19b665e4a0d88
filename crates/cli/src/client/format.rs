//! The `consume --format` template: `%k %v %p %o %t %h %T` or `{key} {value} {partition}
//! {offset} {timestamp} {headers} {topic}`, with `%%`, `\n`, `\t` and `\\` escapes.

use anyhow::{bail, Result};
use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Key,
    Value,
    Partition,
    Offset,
    Timestamp,
    Headers,
    Topic,
}

/// The fields of one record, as the template sees them.
pub struct Fields<'a> {
    pub topic: &'a str,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    pub headers: &'a [(String, Option<Vec<u8>>)],
}

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    pub fn parse(template: &str) -> Result<Self> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = template.chars().peekable();
        let push = |pieces: &mut Vec<Piece>, literal: &mut String, piece: Piece| {
            if !literal.is_empty() {
                pieces.push(Piece::Literal(std::mem::take(literal)));
            }
            pieces.push(piece);
        };
        while let Some(c) = chars.next() {
            match c {
                '%' => {
                    let piece = match chars.next() {
                        Some('k') => Piece::Key,
                        Some('v') => Piece::Value,
                        Some('p') => Piece::Partition,
                        Some('o') => Piece::Offset,
                        Some('t') => Piece::Timestamp,
                        Some('h') => Piece::Headers,
                        Some('T') => Piece::Topic,
                        Some('%') => {
                            literal.push('%');
                            continue;
                        }
                        other => bail!(
                            "unknown placeholder %{} in format (known: %k %v %p %o %t %h %T %%)",
                            other.map(String::from).unwrap_or_default()
                        ),
                    };
                    push(&mut pieces, &mut literal, piece);
                }
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for n in chars.by_ref() {
                        if n == '}' {
                            closed = true;
                            break;
                        }
                        name.push(n);
                    }
                    if !closed {
                        bail!("unclosed {{ in format");
                    }
                    let piece = match name.as_str() {
                        "key" => Piece::Key,
                        "value" => Piece::Value,
                        "partition" => Piece::Partition,
                        "offset" => Piece::Offset,
                        "timestamp" => Piece::Timestamp,
                        "headers" => Piece::Headers,
                        "topic" => Piece::Topic,
                        other => bail!(
                            "unknown placeholder {{{other}}} in format (known: {{key}} {{value}} \
                             {{partition}} {{offset}} {{timestamp}} {{headers}} {{topic}})"
                        ),
                    };
                    push(&mut pieces, &mut literal, piece);
                }
                '\\' => match chars.next() {
                    Some('n') => literal.push('\n'),
                    Some('t') => literal.push('\t'),
                    Some('\\') | None => literal.push('\\'),
                    Some(other) => {
                        literal.push('\\');
                        literal.push(other);
                    }
                },
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(Self { pieces })
    }

    /// Appends the rendered record (without a newline) to `out`.
    pub fn render(&self, f: &Fields<'_>, out: &mut String) {
        for piece in &self.pieces {
            match piece {
                Piece::Literal(s) => out.push_str(s),
                Piece::Key => push_bytes(out, f.key),
                Piece::Value => push_bytes(out, f.value),
                Piece::Partition => {
                    let _ = write!(out, "{}", f.partition);
                }
                Piece::Offset => {
                    let _ = write!(out, "{}", f.offset);
                }
                Piece::Timestamp => match f.timestamp_ms {
                    Some(ts) => {
                        let _ = write!(out, "{ts}");
                    }
                    None => out.push_str("-1"),
                },
                Piece::Headers => {
                    for (i, (k, v)) in f.headers.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(k);
                        out.push('=');
                        push_bytes(out, v.as_deref());
                    }
                }
                Piece::Topic => out.push_str(f.topic),
            }
        }
    }
}

/// Bytes as UTF-8 (lossy), `null` for an absent key or value.
fn push_bytes(out: &mut String, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => out.push_str(&String::from_utf8_lossy(b)),
        None => out.push_str("null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str) -> String {
        let headers = vec![
            ("h1".to_string(), Some(b"x".to_vec())),
            ("h2".to_string(), None),
        ];
        let fields = Fields {
            topic: "t",
            key: Some(b"k"),
            value: Some(b"v"),
            partition: 2,
            offset: 42,
            timestamp_ms: Some(1_700_000_000_000),
            headers: &headers,
        };
        let mut out = String::new();
        Template::parse(template).unwrap().render(&fields, &mut out);
        out
    }

    #[test]
    fn percent_placeholders() {
        assert_eq!(
            render("%k=%v @%p/%o %t [%h] %T 100%%"),
            "k=v @2/42 1700000000000 [h1=x,h2=null] t 100%"
        );
    }

    #[test]
    fn brace_placeholders_and_escapes() {
        assert_eq!(
            render(r"{key}\t{value}\n{partition}:{offset}:{timestamp}:{headers}:{topic}"),
            "k\tv\n2:42:1700000000000:h1=x,h2=null:t"
        );
    }

    #[test]
    fn unknown_placeholders_are_errors() {
        assert!(Template::parse("%x").is_err());
        assert!(Template::parse("{nope}").is_err());
        assert!(Template::parse("{key").is_err());
    }

    #[test]
    fn null_key() {
        let fields = Fields {
            topic: "t",
            key: None,
            value: Some(b"v"),
            partition: 0,
            offset: 0,
            timestamp_ms: None,
            headers: &[],
        };
        let mut out = String::new();
        Template::parse("%k %v %t")
            .unwrap()
            .render(&fields, &mut out);
        assert_eq!(out, "null v -1");
    }
}
