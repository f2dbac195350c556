//! The layers import only downwards: app → ui → model → gpu (DESIGN.md). A `use` that runs back
//! up fails here, naming the file and line.

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_layer_imports_a_layer_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rules = [
        ("gpu", &["crate::model", "crate::ui", "crate::app"][..]),
        ("model", &["crate::ui", "crate::app"][..]),
        ("ui", &["crate::app"][..]),
    ];
    let mut bad = Vec::new();
    for (layer, forbidden) in rules {
        let mut files = Vec::new();
        sources(&root.join(layer), &mut files);
        assert!(!files.is_empty(), "no sources under src/{layer}");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, line) in text.lines().enumerate() {
                if forbidden.iter().any(|p| line.contains(p)) {
                    bad.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports against the layering:\n{}",
        bad.join("\n")
    );
}
