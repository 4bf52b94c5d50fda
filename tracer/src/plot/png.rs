//! SVG to PNG with resvg, at twice the SVG's size (crisp on high-density screens and in
//! documents).

use resvg::{tiny_skia, usvg};

const SCALE: f32 = 2.0;

pub struct Png {
    pub data: Vec<u8>,
    /// Whether system fonts were found (without them the picture has no text).
    pub fonts: bool,
}

pub fn rasterise(svg: &str) -> anyhow::Result<Png> {
    let mut options = usvg::Options::default();
    options.fontdb_mut().load_system_fonts();
    let fonts = !options.fontdb.is_empty();
    let tree = usvg::Tree::from_str(svg, &options)?;
    let size = tree
        .size()
        .to_int_size()
        .scale_by(SCALE)
        .ok_or_else(|| anyhow::anyhow!("the picture is too large for a PNG"))?;
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| anyhow::anyhow!("the picture is too large for a PNG"))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(SCALE, SCALE),
        &mut pixmap.as_mut(),
    );
    Ok(Png {
        data: pixmap.encode_png()?,
        fonts,
    })
}
