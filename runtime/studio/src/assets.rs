//! The page's files, embedded in the binary: our own HTML, script and style, and uPlot's (from npm, found by
//! `build.rs`), so `trinity studio` needs nothing beside the binary.

pub(crate) struct Asset {
    pub(crate) name: &'static str,
    pub(crate) content_type: &'static str,
    pub(crate) body: &'static [u8],
}

const INDEX_HTML: &str = include_str!("../assets/index.html");

/// Where `index.html` carries the studio's per-session token (see `request_guard`).
const TOKEN_PLACEHOLDER: &str = "{{studio-token}}";

/// The page, with this session's token in it.
pub(crate) fn index_html(token: &str) -> String {
    INDEX_HTML.replace(TOKEN_PLACEHOLDER, token)
}

const ASSETS: &[Asset] = &[
    Asset { name: "app.js", content_type: "text/javascript; charset=utf-8", body: include_bytes!("../assets/app.js") },
    Asset { name: "app.css", content_type: "text/css; charset=utf-8", body: include_bytes!("../assets/app.css") },
    Asset {
        name: "uPlot.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!(concat!(env!("TRINITY_STUDIO_UPLOT_DIR"), "/uPlot.iife.min.js")),
    },
    Asset {
        name: "uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!(concat!(env!("TRINITY_STUDIO_UPLOT_DIR"), "/uPlot.min.css")),
    },
];

pub(crate) fn find(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|asset| asset.name == name)
}
