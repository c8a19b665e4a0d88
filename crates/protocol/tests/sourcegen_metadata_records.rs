//! gregor's generator of `src/metadata_records/generated.rs` from Kafka's KIP-631 metadata
//! record schemas, vendored unchanged under `schemas/metadata/` (see the README there).
//!
//! Run as a test so that the generated file is committed and reviewable, and a schema change
//! that is not regenerated fails CI: when the file on disk differs from what the schemas
//! produce, the test rewrites it and fails; run it again and commit the diff. The test needs
//! the crate to compile; should a generator change ever leave `generated.rs` uncompilable,
//! comment out `pub mod metadata_records;` in `lib.rs`, run the test, and restore the line.
//!
//! The generator handles what the metadata schemas use and refuses anything else loudly:
//! every message is flexible from version 0 (`"flexibleVersions": "0+"`), a tagged field is
//! tagged in every version it exists in, a nullable field is nullable in every version it
//! exists in, struct-typed fields only appear as arrays, and no struct field is tagged.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// A version range of a schema: `min..=max`, open-ended when `max` is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Versions {
    min: i16,
    max: Option<i16>,
}

impl Versions {
    fn parse(s: &str) -> Versions {
        if let Some(min) = s.strip_suffix('+') {
            return Versions {
                min: min.parse().expect("a version"),
                max: None,
            };
        }
        if let Some((a, b)) = s.split_once('-') {
            return Versions {
                min: a.parse().expect("a version"),
                max: Some(b.parse().expect("a version")),
            };
        }
        let v = s.parse().expect("a version");
        Versions {
            min: v,
            max: Some(v),
        }
    }

    /// Rust condition that `version` lies in `self`, knowing it lies in `valid`; `None` when
    /// that is always true.
    fn cond(&self, valid: Versions) -> Option<String> {
        let lower = self.min > valid.min;
        let upper = match (self.max, valid.max) {
            (Some(m), Some(v)) => m < v,
            (Some(_), None) => true,
            (None, _) => false,
        };
        match (lower, upper) {
            (false, false) => None,
            (true, false) => Some(format!("version >= {}", self.min)),
            (false, true) => Some(format!("version <= {}", self.max.unwrap_or(i16::MAX))),
            (true, true) => Some(format!(
                "({}..={}).contains(&version)",
                self.min,
                self.max.unwrap_or(i16::MAX)
            )),
        }
    }

    /// Rust condition that `version` lies outside `self`, knowing it lies in `valid`; `None`
    /// when it never does.
    fn cond_not(&self, valid: Versions) -> Option<String> {
        let c = self.cond(valid)?;
        Some(if let Some(min) = c.strip_prefix("version >= ") {
            format!("version < {min}")
        } else if let Some(max) = c.strip_prefix("version <= ") {
            format!("version > {max}")
        } else {
            format!("!{c}")
        })
    }

    fn describe(&self) -> String {
        match self.max {
            None => format!("{}+", self.min),
            Some(m) if m == self.min => format!("{m}"),
            Some(m) => format!("{}-{m}", self.min),
        }
    }
}

#[derive(Debug, Clone)]
enum Ty {
    Bool,
    I8,
    I16,
    U16,
    I32,
    I64,
    F64,
    Uuid,
    Str,
    Bytes,
    Array(Box<Ty>),
    Struct(String),
}

impl Ty {
    fn parse(s: &str) -> Ty {
        if let Some(elem) = s.strip_prefix("[]") {
            return Ty::Array(Box::new(Ty::parse(elem)));
        }
        match s {
            "bool" => Ty::Bool,
            "int8" => Ty::I8,
            "int16" => Ty::I16,
            "uint16" => Ty::U16,
            "int32" => Ty::I32,
            "int64" => Ty::I64,
            "float64" => Ty::F64,
            "uuid" => Ty::Uuid,
            "string" => Ty::Str,
            "bytes" => Ty::Bytes,
            other if other.starts_with(|c: char| c.is_ascii_uppercase()) => {
                Ty::Struct(other.to_string())
            }
            other => panic!("type {other} is not used by the metadata schemas"),
        }
    }

    fn rust(&self) -> String {
        match self {
            Ty::Bool => "bool".into(),
            Ty::I8 => "i8".into(),
            Ty::I16 => "i16".into(),
            Ty::U16 => "u16".into(),
            Ty::I32 => "i32".into(),
            Ty::I64 => "i64".into(),
            Ty::F64 => "f64".into(),
            Ty::Uuid => "Uuid".into(),
            Ty::Str => "String".into(),
            Ty::Bytes => "Vec<u8>".into(),
            Ty::Array(e) => format!("Vec<{}>", e.rust()),
            Ty::Struct(n) => n.clone(),
        }
    }

    /// Smallest encoding of one value, to bound array counts by the bytes left.
    fn min_bytes(&self) -> usize {
        match self {
            Ty::Bool | Ty::I8 | Ty::Str | Ty::Bytes | Ty::Array(_) | Ty::Struct(_) => 1,
            Ty::I16 | Ty::U16 => 2,
            Ty::I32 => 4,
            Ty::I64 | Ty::F64 => 8,
            Ty::Uuid => 16,
        }
    }

    fn reader(&self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::I8 => "i8",
            Ty::I16 => "i16",
            Ty::U16 => "u16",
            Ty::I32 => "i32",
            Ty::I64 => "i64",
            Ty::F64 => "f64",
            Ty::Uuid => "uuid",
            Ty::Str => "string",
            Ty::Bytes => "bytes",
            Ty::Array(_) => "array",
            Ty::Struct(_) => unreachable!("structs are read by their own decode"),
        }
    }
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    snake: String,
    ty: Ty,
    versions: Versions,
    nullable: bool,
    tag: Option<u32>,
    default: Option<String>,
    about: String,
}

#[derive(Debug, Clone)]
struct StructDef {
    name: String,
    doc: Vec<String>,
    /// The versions of the message the struct belongs to.
    valid: Versions,
    fields: Vec<Field>,
    /// `(api key, file name)` for a top-level record.
    top: Option<(u16, String)>,
}

fn snake(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev_lower = i > 0 && !chars[i - 1].is_ascii_uppercase();
            let next_lower = chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            let prev_upper = i > 0 && chars[i - 1].is_ascii_uppercase();
            if i > 0 && (prev_lower || (prev_upper && next_lower)) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(*c);
        }
    }
    out
}

/// Strips `//` comment lines (Kafka's schemas are JSON with comments); returns the JSON and
/// the comments that sit inside the top-level object (the schema's notes, not its licence).
fn strip_comments(text: &str) -> (String, Vec<String>) {
    let mut json = String::new();
    let mut notes = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(c) = t.strip_prefix("//") {
            if inside {
                notes.push(c.trim().to_string());
            }
            continue;
        }
        if t.starts_with('{') {
            inside = true;
        }
        json.push_str(line);
        json.push('\n');
    }
    (json, notes)
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn parse_fields(
    owner: &str,
    fields: &Value,
    valid: Versions,
    structs: &mut Vec<StructDef>,
) -> Vec<Field> {
    let mut out = Vec::new();
    for f in fields.as_array().expect("fields is an array") {
        let name = str_of(f, "name").expect("a field name").to_string();
        let ty = Ty::parse(str_of(f, "type").expect("a field type"));
        let versions = Versions::parse(str_of(f, "versions").expect("field versions"));
        let nullable = match str_of(f, "nullableVersions") {
            None => false,
            Some(n) => {
                let n = Versions::parse(n);
                assert!(
                    n.min <= versions.min && n.max.is_none(),
                    "{owner}.{name}: nullable in only some of its versions"
                );
                true
            }
        };
        let tag = f
            .get("tag")
            .map(|t| u32::try_from(t.as_u64().expect("a numeric tag")).expect("a small tag"));
        if let Some(tv) = str_of(f, "taggedVersions") {
            assert_eq!(
                Versions::parse(tv),
                versions,
                "{owner}.{name}: tagged in only some of its versions"
            );
            assert!(
                tag.is_some(),
                "{owner}.{name}: tagged versions without a tag"
            );
        } else {
            assert!(
                tag.is_none(),
                "{owner}.{name}: a tag without tagged versions"
            );
        }
        if let Some(sub) = f.get("fields") {
            let Ty::Array(elem) = &ty else {
                panic!("{owner}.{name}: a struct field that is not an array")
            };
            let Ty::Struct(struct_name) = elem.as_ref() else {
                panic!("{owner}.{name}: fields on a non-struct array")
            };
            assert!(tag.is_none(), "{owner}.{name}: a tagged struct array");
            let fields = parse_fields(struct_name, sub, valid, structs);
            structs.push(StructDef {
                name: struct_name.clone(),
                doc: vec![format!(
                    "An element of `{owner}.{name}`: {}",
                    str_of(f, "about").unwrap_or_default()
                )],
                valid,
                fields,
                top: None,
            });
        }
        let default = f.get("default").map(|d| match d {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        if default.as_deref() == Some("null") {
            assert!(nullable, "{owner}.{name}: default null but not nullable");
        }
        out.push(Field {
            snake: snake(&name),
            name,
            ty,
            versions,
            nullable,
            tag,
            default,
            about: str_of(f, "about").unwrap_or_default().to_string(),
        });
    }
    out
}

fn parse_schema(file: &str, text: &str, structs: &mut Vec<StructDef>) {
    let (json, notes) = strip_comments(text);
    let v: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(
        str_of(&v, "type"),
        Some("metadata"),
        "{file}: not a metadata schema"
    );
    let name = str_of(&v, "name").expect("a name").to_string();
    assert_eq!(
        str_of(&v, "flexibleVersions"),
        Some("0+"),
        "{file}: the generator only handles messages flexible from version 0"
    );
    let valid = Versions::parse(str_of(&v, "validVersions").expect("validVersions"));
    let api_key = u16::try_from(v["apiKey"].as_u64().expect("an api key")).expect("a small key");
    let fields = parse_fields(&name, &v["fields"], valid, structs);
    let mut doc = vec![format!(
        "`{name}`: metadata record api key {api_key}, versions {} (Kafka 4.4.0's `{file}`).",
        valid.describe()
    )];
    if !notes.is_empty() {
        doc.push(String::new());
        doc.push("Schema notes:".into());
        for n in notes.iter().filter(|n| !n.is_empty()) {
            doc.push(format!("- {n}"));
        }
    }
    structs.push(StructDef {
        name,
        doc,
        valid,
        fields,
        top: Some((api_key, file.to_string())),
    });
}

fn default_expr(f: &Field) -> String {
    let d = f.default.as_deref();
    if f.nullable && d == Some("null") {
        return "None".into();
    }
    let base = match &f.ty {
        Ty::Bool => d.unwrap_or("false").to_string(),
        Ty::I8 | Ty::I16 | Ty::U16 | Ty::I32 | Ty::I64 => {
            let n: i64 = d.unwrap_or("0").parse().expect("a numeric default");
            n.to_string()
        }
        Ty::F64 => format!(
            "{:?}",
            d.unwrap_or("0").parse::<f64>().expect("a float default")
        ),
        Ty::Uuid => {
            assert!(d.is_none(), "{}: uuid defaults are not handled", f.name);
            "Uuid::nil()".into()
        }
        Ty::Str => match d {
            None | Some("") => "String::new()".into(),
            Some(s) => format!("String::from({s:?})"),
        },
        Ty::Bytes | Ty::Array(_) => {
            assert!(
                d.is_none(),
                "{}: non-null default of a bytes or array field",
                f.name
            );
            "Vec::new()".into()
        }
        Ty::Struct(_) => unreachable!("struct fields are arrays"),
    };
    if f.nullable {
        format!("Some({base})")
    } else {
        base
    }
}

/// Condition that `self.<field>` does not hold its default.
fn not_default(f: &Field) -> String {
    let d = default_expr(f);
    let s = &f.snake;
    match d.as_str() {
        "None" => format!("self.{s}.is_some()"),
        "false" => format!("self.{s}"),
        "true" => format!("!self.{s}"),
        "Vec::new()" | "String::new()" => format!("!self.{s}.is_empty()"),
        _ => format!("self.{s} != {d}"),
    }
}

/// Whether the schema default of `f` is also its type's `Default`.
fn is_type_default(f: &Field) -> bool {
    matches!(
        default_expr(f).as_str(),
        "0" | "0.0" | "false" | "None" | "Uuid::nil()" | "String::new()" | "Vec::new()"
    )
}

/// Expression reading one value of `ty` from decoder `d` (a `&mut Decoder` or `Decoder`).
fn read_expr(ty: &Ty, nullable: bool, name: &str, d: &str) -> String {
    match ty {
        Ty::Array(elem) => {
            let elem_read = match elem.as_ref() {
                Ty::Struct(s) => format!("{s}::decode(d, version)"),
                Ty::Array(_) => panic!("{name}: nested arrays are not handled"),
                other => format!("d.{}({name:?})", other.reader()),
            };
            let method = if nullable { "nullable_array" } else { "array" };
            format!(
                "{d}.{method}({name:?}, {}, |d| {elem_read})?",
                elem.min_bytes()
            )
        }
        Ty::Str | Ty::Bytes if nullable => format!("{d}.nullable_{}({name:?})?", ty.reader()),
        _ => {
            assert!(!nullable, "{name}: a nullable primitive");
            format!("{d}.{}({name:?})?", ty.reader())
        }
    }
}

/// Statement writing `self.<field>` with encoder `e`.
fn write_stmt(f: &Field, e: &str) -> String {
    let s = &f.snake;
    let name = &f.name;
    match &f.ty {
        Ty::Array(elem) => {
            let elem_write = match elem.as_ref() {
                Ty::Struct(_) => "x.encode(e, version)".to_string(),
                Ty::Str => format!("e.string({name:?}, x)"),
                Ty::Uuid => "{ e.uuid(x); Ok(()) }".to_string(),
                Ty::Bytes => "{ e.bytes(x); Ok(()) }".to_string(),
                other => format!("{{ e.{}(*x); Ok(()) }}", other.reader()),
            };
            if f.nullable {
                format!("{e}.nullable_array(self.{s}.as_deref(), |e, x| {elem_write})?;")
            } else {
                format!("{e}.array(&self.{s}, |e, x| {elem_write})?;")
            }
        }
        Ty::Str if f.nullable => format!("{e}.nullable_string({name:?}, self.{s}.as_deref())?;"),
        Ty::Str => format!("{e}.string({name:?}, &self.{s})?;"),
        Ty::Bytes if f.nullable => format!("{e}.nullable_bytes(self.{s}.as_deref());"),
        Ty::Bytes => format!("{e}.bytes(&self.{s});"),
        Ty::Uuid => format!("{e}.uuid(&self.{s});"),
        other => format!("{e}.{}(self.{s});", other.reader()),
    }
}

fn rust_field_type(f: &Field) -> String {
    if f.nullable {
        format!("Option<{}>", f.ty.rust())
    } else {
        f.ty.rust()
    }
}

fn field_doc(f: &Field) -> String {
    let mut notes = vec![format!("versions {}", f.versions.describe())];
    if let Some(t) = f.tag {
        notes.push(format!("tagged, tag {t}"));
    }
    if f.nullable {
        notes.push("nullable".into());
    }
    if let Some(d) = &f.default {
        notes.push(format!("default {d}"));
    }
    let about = f.about.trim();
    let sep = if about.ends_with('.') { "" } else { "." };
    format!("`{}`: {about}{sep} ({}.)", f.name, notes.join("; "))
}

fn gen_struct(out: &mut String, s: &StructDef) {
    for line in &s.doc {
        if line.is_empty() {
            writeln!(out, "///").unwrap();
        } else {
            writeln!(out, "/// {line}").unwrap();
        }
    }
    let derive_default = s.fields.iter().all(is_type_default);
    if derive_default {
        writeln!(out, "#[derive(Debug, Clone, PartialEq, Default)]").unwrap();
    } else {
        writeln!(out, "#[derive(Debug, Clone, PartialEq)]").unwrap();
    }
    writeln!(out, "pub struct {} {{", s.name).unwrap();
    for f in &s.fields {
        writeln!(out, "/// {}", field_doc(f)).unwrap();
        writeln!(out, "pub {}: {},", f.snake, rust_field_type(f)).unwrap();
    }
    writeln!(
        out,
        "/// Tagged fields this schema does not define, in the order read; written back in tag order."
    )
    .unwrap();
    writeln!(out, "pub unknown_tagged_fields: Vec<RawTaggedField>,").unwrap();
    writeln!(out, "}}\n").unwrap();

    if !derive_default {
        writeln!(out, "/// Every field at its schema default.").unwrap();
        writeln!(out, "impl Default for {} {{", s.name).unwrap();
        writeln!(out, "fn default() -> Self {{ Self {{").unwrap();
        for f in &s.fields {
            writeln!(out, "{}: {},", f.snake, default_expr(f)).unwrap();
        }
        writeln!(out, "unknown_tagged_fields: Vec::new(),").unwrap();
        writeln!(out, "}} }}\n}}\n").unwrap();
    }

    writeln!(out, "impl {} {{", s.name).unwrap();
    if let Some((api_key, _)) = &s.top {
        writeln!(out, "/// The api key of this record type.").unwrap();
        writeln!(out, "pub const API_KEY: u16 = {api_key};").unwrap();
        writeln!(out, "/// Lowest version of the schema.").unwrap();
        writeln!(out, "pub const LOWEST_VERSION: i16 = {};", s.valid.min).unwrap();
        writeln!(out, "/// Highest version of the schema.").unwrap();
        writeln!(
            out,
            "pub const HIGHEST_VERSION: i16 = {};",
            s.valid.max.expect("a bounded version range")
        )
        .unwrap();
    }

    // decode
    let mut body = String::new();
    let mut uses_version = false;
    for f in s.fields.iter().filter(|f| f.tag.is_none()) {
        let read = read_expr(&f.ty, f.nullable, &f.name, "d");
        uses_version |= read.contains(", version)");
        match f.versions.cond(s.valid) {
            None => writeln!(body, "this.{} = {read};", f.snake).unwrap(),
            Some(c) => {
                uses_version = true;
                writeln!(body, "if {c} {{ this.{} = {read}; }}", f.snake).unwrap();
            }
        }
    }
    let mut tagged: Vec<&Field> = s.fields.iter().filter(|f| f.tag.is_some()).collect();
    tagged.sort_by_key(|f| f.tag);
    writeln!(body, "for _ in 0..d.tagged_field_count()? {{").unwrap();
    writeln!(body, "let (tag, data) = d.tagged_field()?;").unwrap();
    let unknown = "this.unknown_tagged_fields.push(RawTaggedField { tag, data: data.to_vec() })";
    if tagged.is_empty() {
        writeln!(body, "{unknown};").unwrap();
    } else {
        writeln!(body, "match tag {{").unwrap();
        for f in &tagged {
            let tag = f.tag.expect("tagged");
            let read = read_expr(&f.ty, f.nullable, &f.name, "t");
            let arm = format!(
                "{{ let mut t = d.sub(data); this.{} = {read}; t.finish_tagged({:?})?; }}",
                f.snake, f.name
            );
            match f.versions.cond(s.valid) {
                None => writeln!(body, "{tag} => {arm}").unwrap(),
                Some(c) => {
                    uses_version = true;
                    writeln!(body, "{tag} if {c} => {arm}").unwrap();
                    writeln!(
                        body,
                        "{tag} => return Err(d.tag_not_valid({tag}, version)),"
                    )
                    .unwrap();
                }
            }
        }
        writeln!(body, "_ => {unknown},").unwrap();
        writeln!(body, "}}").unwrap();
    }
    writeln!(body, "}}").unwrap();
    let v = if uses_version { "version" } else { "_version" };
    writeln!(
        out,
        "// Fields start at their defaults: those this version lacks keep them.\n\
         #[allow(clippy::field_reassign_with_default)]"
    )
    .unwrap();
    writeln!(
        out,
        "pub(crate) fn decode(d: &mut Decoder<'_>, {v}: i16) -> Result<Self, MetadataRecordError> {{"
    )
    .unwrap();
    writeln!(out, "let mut this = Self::default();").unwrap();
    out.push_str(&body);
    writeln!(out, "Ok(this)\n}}\n").unwrap();

    // encode
    let mut body = String::new();
    let mut uses_version = false;
    for f in s.fields.iter().filter(|f| f.tag.is_none()) {
        let write = write_stmt(f, "e");
        uses_version |= write.contains(", version)");
        match f.versions.cond(s.valid) {
            None => writeln!(body, "{write}").unwrap(),
            Some(c) => {
                uses_version = true;
                writeln!(
                    body,
                    "if {c} {{ {write} }} else if {} {{ return Err(e.not_in_version({:?}, version)); }}",
                    not_default(f),
                    f.name
                )
                .unwrap();
            }
        }
    }
    if tagged.is_empty() {
        writeln!(
            body,
            "e.tagged_fields(Vec::new(), &self.unknown_tagged_fields);"
        )
        .unwrap();
    } else {
        writeln!(body, "let mut tagged = Vec::new();").unwrap();
        for f in &tagged {
            let tag = f.tag.expect("tagged");
            let write = write_stmt(f, "t");
            uses_version |= write.contains(", version)");
            let put = format!(
                "if {} {{ let mut t = e.sub(); {write} tagged.push(({tag}, t.into_bytes())); }}",
                not_default(f)
            );
            match f.versions.cond(s.valid) {
                None => writeln!(body, "{put}").unwrap(),
                Some(c) => {
                    uses_version = true;
                    writeln!(
                        body,
                        "if {c} {{ {put} }} else if {} {{ return Err(e.not_in_version({:?}, version)); }}",
                        not_default(f),
                        f.name
                    )
                    .unwrap();
                }
            }
        }
        writeln!(
            body,
            "e.tagged_fields(tagged, &self.unknown_tagged_fields);"
        )
        .unwrap();
    }
    let v = if uses_version { "version" } else { "_version" };
    writeln!(
        out,
        "pub(crate) fn encode(&self, e: &mut Encoder, {v}: i16) -> Result<(), MetadataRecordError> {{"
    )
    .unwrap();
    out.push_str(&body);
    writeln!(out, "Ok(())\n}}\n").unwrap();

    // clear_absent_fields
    let mut body = String::new();
    let mut uses_version = false;
    for f in &s.fields {
        if let Some(c) = f.versions.cond_not(s.valid) {
            uses_version = true;
            writeln!(body, "if {c} {{ self.{} = {}; }}", f.snake, default_expr(f)).unwrap();
        }
        if let Ty::Array(elem) = &f.ty {
            if let Ty::Struct(_) = elem.as_ref() {
                uses_version = true;
                writeln!(
                    body,
                    "for x in &mut self.{} {{ x.clear_absent_fields(version); }}",
                    f.snake
                )
                .unwrap();
            }
        }
    }
    let v = if uses_version { "version" } else { "_version" };
    writeln!(
        out,
        "/// Sets every field that `version` lacks to its default, in nested structs too: the \
         value a round trip through that version gives."
    )
    .unwrap();
    writeln!(out, "pub fn clear_absent_fields(&mut self, {v}: i16) {{").unwrap();
    out.push_str(&body);
    writeln!(out, "}}\n}}\n").unwrap();
}

fn strategy(ty: &Ty, nullable: bool) -> String {
    let base = match ty {
        Ty::Bool => "any::<bool>()".to_string(),
        Ty::I8 => "any::<i8>()".into(),
        Ty::I16 => "any::<i16>()".into(),
        Ty::U16 => "any::<u16>()".into(),
        Ty::I32 => "any::<i32>()".into(),
        Ty::I64 => "any::<i64>()".into(),
        Ty::F64 => "arb_f64()".into(),
        Ty::Uuid => "arb_uuid()".into(),
        Ty::Str => "arb_string()".into(),
        Ty::Bytes => "vec(any::<u8>(), 0..8)".into(),
        Ty::Array(e) => format!("vec({}, 0..4)", strategy(e, false)),
        Ty::Struct(s) => format!("{}()", snake(s)),
    };
    if nullable {
        format!("option::of({base})")
    } else {
        base
    }
}

fn gen_strategy(out: &mut String, s: &StructDef) {
    let mut parts: Vec<(String, String)> = s
        .fields
        .iter()
        .map(|f| (f.snake.clone(), strategy(&f.ty, f.nullable)))
        .collect();
    parts.push((
        "unknown_tagged_fields".into(),
        "arb_unknown_tagged_fields()".into(),
    ));
    let chunks: Vec<&[(String, String)]> = parts.chunks(6).collect();
    let strategies: Vec<String> = chunks
        .iter()
        .map(|c| {
            format!(
                "({},)",
                c.iter()
                    .map(|(_, s)| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
    let patterns: Vec<String> = chunks
        .iter()
        .map(|c| {
            format!(
                "({},)",
                c.iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
    let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    writeln!(
        out,
        "pub(crate) fn {}() -> impl Strategy<Value = {}> {{",
        snake(&s.name),
        s.name
    )
    .unwrap();
    writeln!(
        out,
        "({},).prop_map(|({},)| {} {{ {} }})",
        strategies.join(", "),
        patterns.join(", "),
        s.name,
        names.join(", ")
    )
    .unwrap();
    writeln!(out, "}}\n").unwrap();
}

fn variant(name: &str) -> &str {
    name.strip_suffix("Record").unwrap_or(name)
}

fn generate(structs: &[StructDef]) -> String {
    let mut out = String::new();
    out.push_str(
        "// @generated by crates/protocol/tests/sourcegen_metadata_records.rs from the schemas in\n\
         // crates/protocol/schemas/metadata/ (Apache Kafka 4.4.0). Do not edit by hand.\n\n\
         //! The KIP-631 metadata records, one struct per schema, and [`MetadataRecord`] over them.\n\n\
         use uuid::Uuid;\n\n\
         use super::{Decoder, Encoder, MetadataRecordError, MetadataRecordType, RawTaggedField};\n\n",
    );
    for s in structs {
        gen_struct(&mut out, s);
    }
    let mut tops: Vec<&StructDef> = structs.iter().filter(|s| s.top.is_some()).collect();
    tops.sort_by_key(|s| s.top.as_ref().map(|t| t.0));

    writeln!(
        out,
        "/// Every metadata record type Kafka 4.4.0 defines, by api key."
    )
    .unwrap();
    writeln!(
        out,
        "pub const METADATA_RECORD_TYPES: [MetadataRecordType; {}] = [",
        tops.len()
    )
    .unwrap();
    for s in &tops {
        writeln!(
            out,
            "MetadataRecordType {{ api_key: {n}::API_KEY, name: {:?}, lowest_version: {n}::LOWEST_VERSION, highest_version: {n}::HIGHEST_VERSION }},",
            s.name,
            n = s.name
        )
        .unwrap();
    }
    writeln!(out, "];\n").unwrap();

    writeln!(
        out,
        "/// One metadata record of any type: the body of a framed record (see \
         [`super::decode_framed`])."
    )
    .unwrap();
    writeln!(out, "#[derive(Debug, Clone, PartialEq)]").unwrap();
    writeln!(out, "pub enum MetadataRecord {{").unwrap();
    for s in &tops {
        let (key, _) = s.top.as_ref().expect("top");
        writeln!(out, "/// [`{}`] (api key {key}).", s.name).unwrap();
        writeln!(out, "{}({}),", variant(&s.name), s.name).unwrap();
    }
    writeln!(out, "}}\n").unwrap();

    writeln!(out, "impl MetadataRecord {{").unwrap();
    writeln!(
        out,
        "/// The api key, name and versions of this record's type."
    )
    .unwrap();
    writeln!(
        out,
        "pub fn record_type(&self) -> &'static MetadataRecordType {{ match self {{"
    )
    .unwrap();
    for (i, s) in tops.iter().enumerate() {
        writeln!(
            out,
            "Self::{}(_) => &METADATA_RECORD_TYPES[{i}],",
            variant(&s.name)
        )
        .unwrap();
    }
    writeln!(out, "}} }}\n").unwrap();
    writeln!(
        out,
        "/// The record of type `api_key` with every field at its schema default; `None` for an \
         unknown key."
    )
    .unwrap();
    writeln!(
        out,
        "pub fn default_for(api_key: u16) -> Option<Self> {{ match api_key {{"
    )
    .unwrap();
    for s in &tops {
        writeln!(
            out,
            "{n}::API_KEY => Some(Self::{}({n}::default())),",
            variant(&s.name),
            n = s.name
        )
        .unwrap();
    }
    writeln!(out, "_ => None,\n}} }}\n").unwrap();
    writeln!(out, "/// The record type's api key.").unwrap();
    writeln!(
        out,
        "pub fn api_key(&self) -> u16 {{ self.record_type().api_key }}\n"
    )
    .unwrap();

    writeln!(out, "pub(crate) fn decode_body(api_key: u16, version: i16, d: &mut Decoder<'_>) -> Result<Self, MetadataRecordError> {{ match api_key {{").unwrap();
    for s in &tops {
        writeln!(
            out,
            "{}::API_KEY => Ok(Self::{}({}::decode(d, version)?)),",
            s.name,
            variant(&s.name),
            s.name
        )
        .unwrap();
    }
    writeln!(
        out,
        "_ => Err(MetadataRecordError::UnknownApiKey(u32::from(api_key))),"
    )
    .unwrap();
    writeln!(out, "}} }}\n").unwrap();

    writeln!(out, "pub(crate) fn encode_body(&self, version: i16, e: &mut Encoder) -> Result<(), MetadataRecordError> {{ match self {{").unwrap();
    for s in &tops {
        writeln!(
            out,
            "Self::{}(r) => r.encode(e, version),",
            variant(&s.name)
        )
        .unwrap();
    }
    writeln!(out, "}} }}\n").unwrap();

    writeln!(
        out,
        "/// Sets every field that `version` lacks to its default, in nested structs too: the \
         value a round trip through that version gives."
    )
    .unwrap();
    writeln!(
        out,
        "pub fn clear_absent_fields(&mut self, version: i16) {{ match self {{"
    )
    .unwrap();
    for s in &tops {
        writeln!(
            out,
            "Self::{}(r) => r.clear_absent_fields(version),",
            variant(&s.name)
        )
        .unwrap();
    }
    writeln!(out, "}} }}\n}}\n").unwrap();

    for s in &tops {
        writeln!(
            out,
            "impl From<{n}> for MetadataRecord {{ fn from(r: {n}) -> Self {{ Self::{}(r) }} }}\n",
            variant(&s.name),
            n = s.name
        )
        .unwrap();
    }

    // Strategies for the property tests.
    writeln!(
        out,
        "/// proptest strategies for every struct, for the round-trip tests."
    )
    .unwrap();
    writeln!(out, "#[cfg(test)]\npub(crate) mod arbitrary {{").unwrap();
    writeln!(out, "use proptest::collection::vec;\nuse proptest::option;\nuse proptest::prelude::*;\nuse proptest::strategy::Union;\n").unwrap();
    writeln!(out, "use super::*;\nuse crate::metadata_records::tests::{{arb_f64, arb_string, arb_unknown_tagged_fields, arb_uuid}};\n").unwrap();
    for s in structs {
        gen_strategy(&mut out, s);
    }
    writeln!(
        out,
        "/// Any metadata record, with any field values.\npub(crate) fn metadata_record() -> impl Strategy<Value = MetadataRecord> {{ Union::new(vec!["
    )
    .unwrap();
    for s in &tops {
        writeln!(
            out,
            "{}().prop_map(MetadataRecord::{}).boxed(),",
            snake(&s.name),
            variant(&s.name)
        )
        .unwrap();
    }
    writeln!(out, "]) }}\n}}").unwrap();
    out
}

fn rustfmt(code: &str) -> String {
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2021"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("rustfmt runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(code.as_bytes())
        .expect("writing to rustfmt");
    let out = child.wait_with_output().expect("rustfmt finishes");
    assert!(out.status.success(), "rustfmt failed on the generated code");
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn generated_metadata_records_match_the_schemas() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("schemas/metadata");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the schema directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut structs = Vec::new();
    for path in &files {
        let file = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(path).expect("a readable schema");
        parse_schema(&file, &text, &mut structs);
    }
    assert_eq!(
        structs.iter().filter(|s| s.top.is_some()).count(),
        files.len()
    );
    let code = rustfmt(&generate(&structs));
    let target = root.join("src/metadata_records/generated.rs");
    let current = std::fs::read_to_string(&target).unwrap_or_default();
    if current != code {
        std::fs::write(&target, &code).expect("writing generated.rs");
        panic!(
            "{} did not match the schemas and has been regenerated: review and commit it",
            target.display()
        );
    }
}
