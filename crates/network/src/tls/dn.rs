//! The distinguished name of a certificate's subject as Java's
//! `X500Principal.getName(X500Principal.RFC2253)` renders it, which is what Kafka's
//! `DefaultKafkaPrincipalBuilder` hands to `ssl.principal.mapping.rules`
//! (`CN=alice,OU=eng,O=Example,C=US`).
//!
//! RFC 2253: the RDNs from last to first as encoded, `,` between them, `+` between the
//! attributes of a multi-valued RDN; the keywords CN, C, L, ST, O, OU, STREET, DC and UID,
//! any other attribute as its dotted OID with `#` and the hex of its DER value; in string
//! values `,` `+` `"` `\` `<` `>` `;` are escaped with `\`, as are a leading `#` or space and
//! a trailing space.

use x509_parser::der_parser::asn1_rs::{Any, FromDer, Tag, ToDer};
use x509_parser::prelude::{X509Certificate, X509Name};

/// The RFC 2253 subject of the DER certificate `der`.
///
/// # Errors
/// A message when `der` is not an X.509 certificate.
pub fn subject_rfc2253(der: &[u8]) -> Result<String, String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| e.to_string())?;
    Ok(rfc2253(cert.subject()))
}

/// `name` rendered as Java's `X500Principal.getName(RFC2253)`.
pub fn rfc2253(name: &X509Name<'_>) -> String {
    let rdns: Vec<String> = name
        .iter()
        .map(|rdn| {
            rdn.iter()
                .map(|ava| {
                    let oid = ava.attr_type().to_id_string();
                    let value = ava.attr_value();
                    match keyword(&oid) {
                        Some(k) => match string_value(value) {
                            Some(s) => format!("{k}={}", escape(&s)),
                            None => format!("{k}={}", hex_value(value)),
                        },
                        None => format!("{oid}={}", hex_value(value)),
                    }
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

fn keyword(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.9" => "STREET",
        "0.9.2342.19200300.100.1.25" => "DC",
        "0.9.2342.19200300.100.1.1" => "UID",
        _ => return None,
    })
}

/// The value of a directory string (UTF8String, PrintableString, IA5String, T61String,
/// BMPString, UniversalString), or `None` for another type (rendered as hex).
fn string_value(value: &Any<'_>) -> Option<String> {
    let data = value.data;
    match value.tag() {
        Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::VisibleString => {
            std::str::from_utf8(data).ok().map(str::to_string)
        }
        // Teletex: Java decodes it as ISO-8859-1.
        Tag::T61String => Some(data.iter().map(|&b| char::from(b)).collect()),
        Tag::BmpString => {
            let units: Vec<u16> = data
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        Tag::UniversalString => data
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        _ => None,
    }
}

/// `#` and the lower-case hex of the value's DER encoding (tag, length and content).
fn hex_value(value: &Any<'_>) -> String {
    let der = value.to_der_vec().unwrap_or_default();
    let mut s = String::with_capacity(1 + der.len() * 2);
    s.push('#');
    for b in der {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let count = value.chars().count();
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i + 1 == count && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Parses a DER value (used by tests to check round trips).
#[cfg(test)]
fn any(der: &[u8]) -> Any<'_> {
    Any::from_der(der).expect("DER").1
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair};

    fn subject_of(entries: &[(DnType, &str)]) -> String {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in entries {
            params.distinguished_name.push(t.clone(), *v);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        subject_rfc2253(cert.der()).unwrap()
    }

    #[test]
    fn renders_last_rdn_first_with_keywords() {
        assert_eq!(
            subject_of(&[
                (DnType::CountryName, "US"),
                (DnType::OrganizationName, "Example"),
                (DnType::OrganizationalUnitName, "eng"),
                (DnType::CommonName, "alice"),
            ]),
            "CN=alice,OU=eng,O=Example,C=US"
        );
    }

    #[test]
    fn escapes_special_characters() {
        assert_eq!(
            subject_of(&[(DnType::CommonName, "#a, b+c;\"d\\ ")]),
            r#"CN=\#a\, b\+c\;\"d\\\ "#
        );
    }

    #[test]
    fn other_attributes_are_oid_and_hex() {
        // emailAddress (PKCS #9) as an IA5String "a@b".
        let s = subject_of(&[
            (
                DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]),
                "a@b",
            ),
            (DnType::CommonName, "x"),
        ]);
        assert!(s.starts_with("CN=x,1.2.840.113549.1.9.1=#"), "{s}");
        assert_eq!(hex_value(&any(&[0x16, 0x01, b'z'])), "#16017a");
    }
}
