//! An SVG document built element by element: text, rectangles, lines, paths and circles,
//! each one line of SVG.

use std::fmt::Write as _;

use super::theme::{FONT, GLYPH_EM, TEXT};

pub struct Canvas {
    body: String,
    width: f64,
}

impl Canvas {
    /// An empty picture `width` CSS pixels wide.
    pub fn new(width: f64) -> Self {
        Canvas {
            body: String::with_capacity(256 << 10),
            width,
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one SVG text element's attributes"
    )]
    pub fn text(
        &mut self,
        x: f64,
        y: f64,
        text: &str,
        size: f64,
        anchor: &str,
        weight: &str,
        fill: &str,
    ) {
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" fill="{fill}">{}</text>"#,
            escape(text)
        );
    }

    /// Body text: 12 px, left-aligned.
    pub fn label(&mut self, x: f64, y: f64, text: &str) {
        self.text(x, y, text, 12.0, "start", "normal", TEXT);
    }

    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, opacity: f64) {
        let _ = writeln!(
            self.body,
            r#"<rect x="{x:.2}" y="{y:.2}" width="{:.2}" height="{:.2}" fill="{fill}" fill-opacity="{opacity:.2}"/>"#,
            w.max(0.0),
            h.max(0.0)
        );
    }

    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str) {
        let _ = writeln!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" stroke-width="1"/>"#
        );
    }

    /// A filled and stroked path (`d` in SVG path syntax).
    pub fn path(&mut self, d: &str, color: &str, fill_opacity: f64) {
        let _ = writeln!(
            self.body,
            r#"<path d="{d}" fill="{color}" fill-opacity="{fill_opacity:.2}" stroke="{color}" stroke-width="1.5"/>"#
        );
    }

    /// A stroked, unfilled path (`d` in SVG path syntax).
    pub fn polyline(&mut self, d: &str, color: &str) {
        let _ = writeln!(
            self.body,
            r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"/>"#
        );
    }

    /// A marker dot with a white rim.
    pub fn dot(&mut self, x: f64, y: f64, color: &str) {
        let _ = writeln!(
            self.body,
            r##"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}" stroke="#fff" stroke-width="1"/>"##
        );
    }

    /// The whole document, `height` pixels high, on a white background.
    pub fn finish(self, height: f64) -> String {
        format!(
            r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT}">
<rect x="0" y="0" width="{w}" height="{h}" fill="#fff"/>
{body}</svg>
"##,
            w = self.width,
            h = height.ceil(),
            body = self.body
        )
    }
}

/// Text made safe for SVG content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Not allowed in XML 1.0 at all.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// About how wide `text` is drawn at `size` pixels.
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * GLYPH_EM
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::shorten;

    #[test]
    fn text_is_escaped_and_shortened() {
        assert_eq!(
            escape(r#"a<b>&"c"'d'"#),
            "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;"
        );
        assert_eq!(escape("x\u{1}y"), "x\u{fffd}y");
        assert_eq!(shorten("abcdef", 4), "abc…");
        assert_eq!(shorten("abc", 4), "abc");
    }
}
