//! Reading the repository's documents in the tests that check them.

/// The repository's `path` (e.g. `docs/envoy.md`), read whole.
pub fn read(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    std::fs::read_to_string(format!("{root}/{path}"))
        .unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// The fenced ```yaml block that follows the HTML comment `<!-- {marker} -->` in `doc`, with
/// its final newline.
pub fn marked_yaml(doc: &str, marker: &str) -> String {
    let start = doc
        .find(&format!("<!-- {marker} -->"))
        .unwrap_or_else(|| panic!("the document has no `<!-- {marker} -->`"));
    let rest = &doc[start..];
    let open = rest
        .find("```yaml\n")
        .expect("a yaml block after the marker")
        + "```yaml\n".len();
    let len = rest[open..].find("\n```").expect("the block ends");
    rest[open..open + len + 1].to_owned()
}
