//! WinFsp is only loaded delay-loaded (its DLL lives in WinFsp's install folder, not on PATH):
//! winfsp-rs emits the linker flags. Only for a real Windows build (feature `link`), not for the
//! type check.

fn main() {
    let windows = std::env::var("CARGO_CFG_WINDOWS").is_ok();
    if windows && std::env::var("CARGO_FEATURE_LINK").is_ok() {
        winfsp::build::winfsp_link_delayload();
    }
}
