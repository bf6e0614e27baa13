//! The emulated compressing drive (placeholder).
