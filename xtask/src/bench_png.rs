//! A small PNG chart for `cargo xtask bench`: bars drawn into an RGB buffer, labels in a built-in
//! 5x7 pixel font, encoded with flate2 (already a workspace dependency), so the report needs
//! no plotting or font crate.

use anyhow::Result;
use std::io::Write;

pub type Rgb = [u8; 3];
pub const BLACK: Rgb = [30, 30, 30];
pub const GREY: Rgb = [200, 200, 200];
pub const GREGOR: Rgb = [46, 117, 182];
pub const KAFKA: Rgb = [237, 125, 49];
pub const BASELINE: Rgb = [112, 173, 71];

pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Canvas {
    pub fn new(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            pixels: [255u8, 255, 255].repeat(width * height),
        }
    }

    pub fn rect(&mut self, x: usize, y: usize, w: usize, h: usize, color: Rgb) {
        for yy in y..(y + h).min(self.height) {
            for xx in x..(x + w).min(self.width) {
                let i = (yy * self.width + xx) * 3;
                self.pixels[i..i + 3].copy_from_slice(&color);
            }
        }
    }

    /// Text at (x, y) (top left), each font pixel drawn as `scale` x `scale`.
    pub fn text(&mut self, x: usize, y: usize, s: &str, scale: usize, color: Rgb) {
        let mut cx = x;
        for ch in s.chars() {
            let rows = glyph(ch.to_ascii_uppercase());
            for (ry, row) in rows.iter().enumerate() {
                for rx in 0..5 {
                    if row & (0x10 >> rx) != 0 {
                        self.rect(cx + rx * scale, y + ry * scale, scale, scale, color);
                    }
                }
            }
            cx += 6 * scale;
        }
    }

    pub fn text_width(s: &str, scale: usize) -> usize {
        s.chars().count() * 6 * scale
    }

    pub fn png(&self) -> Result<Vec<u8>> {
        let mut raw = Vec::with_capacity((self.width * 3 + 1) * self.height);
        for row in self.pixels.chunks(self.width * 3) {
            raw.push(0); // filter: none
            raw.extend_from_slice(row);
        }
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&raw)?;
        let idat = z.finish()?;
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&u32::try_from(self.width)?.to_be_bytes());
        ihdr.extend_from_slice(&u32::try_from(self.height)?.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
        chunk(&mut out, b"IHDR", &ihdr)?;
        chunk(&mut out, b"IDAT", &idat)?;
        chunk(&mut out, b"IEND", &[])?;
        Ok(out)
    }
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) -> Result<()> {
    out.extend_from_slice(&u32::try_from(data.len())?.to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_be_bytes());
    Ok(())
}

/// 5x7 glyphs, one byte per row, bit 4 leftmost.
fn glyph(c: char) -> [u8; 7] {
    match c {
        '0' => [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        '1' => [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '3' => [0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        '5' => [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        '6' => [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        '7' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        '9' => [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
        'A' => [0x0e, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'B' => [0x1e, 0x11, 0x11, 0x1e, 0x11, 0x11, 0x1e],
        'C' => [0x0e, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0e],
        'D' => [0x1c, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1c],
        'E' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x1f],
        'F' => [0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x10],
        'G' => [0x0e, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0f],
        'H' => [0x11, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11],
        'I' => [0x0e, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0c],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1f],
        'M' => [0x11, 0x1b, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0e, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'P' => [0x1e, 0x11, 0x11, 0x1e, 0x10, 0x10, 0x10],
        'Q' => [0x0e, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0d],
        'R' => [0x1e, 0x11, 0x11, 0x1e, 0x14, 0x12, 0x11],
        'S' => [0x0f, 0x10, 0x10, 0x0e, 0x01, 0x01, 0x1e],
        'T' => [0x1f, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0a, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0a],
        'X' => [0x11, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0a, 0x04, 0x04, 0x04],
        'Z' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1f],
        '.' => [0, 0, 0, 0, 0, 0x0c, 0x0c],
        ',' => [0, 0, 0, 0, 0x0c, 0x04, 0x08],
        '/' => [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0],
        '-' => [0, 0, 0, 0x1f, 0, 0, 0],
        '=' => [0, 0, 0x1f, 0, 0x1f, 0, 0],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        ':' => [0, 0x0c, 0x0c, 0, 0x0c, 0x0c, 0],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        'x' | '*' => [0, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0],
        _ => [0; 7],
    }
}

/// One group of bars: a label and one value per series.
pub struct Group {
    pub label: String,
    pub values: Vec<f64>,
}

/// A bar chart panel at (x, y) of size (w, h): groups side by side, one colour per series.
#[allow(clippy::too_many_arguments)]
pub fn bar_panel(
    c: &mut Canvas,
    x: usize,
    y: usize,
    w: usize,
    h: usize,
    title: &str,
    groups: &[Group],
    colors: &[Rgb],
) {
    c.text(x, y, title, 2, BLACK);
    let top = y + 30;
    let bottom = y + h - 30;
    let max = groups
        .iter()
        .flat_map(|g| g.values.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    c.rect(x, bottom, w, 2, BLACK);
    if groups.is_empty() {
        return;
    }
    let slot = w / groups.len();
    let series = colors.len().max(1);
    let bar_w = (slot.saturating_sub(12) / series).max(2);
    for (gi, g) in groups.iter().enumerate() {
        let gx = x + gi * slot + 6;
        for (si, v) in g.values.iter().enumerate() {
            let bh = ((v / max) * (bottom - top - 14) as f64).max(0.0) as usize;
            let bx = gx + si * bar_w;
            c.rect(
                bx,
                bottom - bh,
                bar_w.saturating_sub(2),
                bh,
                colors[si % colors.len()],
            );
            let label = if *v >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            };
            let tx = bx + bar_w.saturating_sub(Canvas::text_width(&label, 1)) / 2;
            c.text(tx, (bottom - bh).saturating_sub(10), &label, 1, BLACK);
        }
        let lx = gx + (slot.saturating_sub(12)).saturating_sub(Canvas::text_width(&g.label, 1)) / 2;
        c.text(lx, bottom + 8, &g.label, 1, BLACK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_has_signature_and_chunks() {
        let mut c = Canvas::new(40, 20);
        c.text(1, 1, "A1", 1, BLACK);
        let png = c.png().unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert!(png.windows(4).any(|w| w == b"IEND"));
    }
}
