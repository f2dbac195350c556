//! The kernels a compile unit defines, read from its text: literal `HS_KERNEL void name(...)`
//! definitions, and the families generated per weight type — a macro `#define FAM(T, ...)` whose
//! body defines `HS_KERNEL void hs_mv_##T(...)`, applied as `LIST(FAM)` to a type list
//! `#define LIST(X) X(q4_0, ...) X(...)` that the host writes before the source
//! (`compute/plan.rs`). The loader finds each kernel of a module by these names, the fake device
//! reads their parameter widths, `hipscope kernels` lists them; a test holds them to the names
//! the type table gives the launchers.

/// One kernel: its name and the text of its parameter list (between the parentheses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelDecl {
    pub name: String,
    pub params: String,
}

const KERNEL: &str = "HS_KERNEL void";

/// The text with backslash-newline continuations joined, as the preprocessor sees it, split into
/// logical lines.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        match l.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(l);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn ident_len(s: &str) -> usize {
    s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len())
}

/// The text between the parenthesis at the start of `s` and its match, and what follows it.
fn balanced(s: &str) -> Option<(&str, &str)> {
    if !s.starts_with('(') {
        return None;
    }
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&s[1..i], &s[i + 1..]));
                }
            }
            _ => {}
        }
    }
    None
}

/// A kernel definition: its offset, its name as written (which may hold `##T`) and parameters.
type Definition = (usize, String, String);

/// The kernel definitions in `body`.
fn definitions(body: &str) -> Vec<Definition> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = body[from..].find(KERNEL) {
        let start = from + at;
        from = start + KERNEL.len();
        let r = body[from..].trim_start();
        let mut n = ident_len(r);
        // A generated name: ident##PARAM.
        while r[n..].starts_with("##") {
            n += 2 + ident_len(&r[n + 2..]);
        }
        if n == 0 {
            continue;
        }
        let name = r[..n].to_string();
        if let Some((params, _)) = balanced(r[n..].trim_start()) {
            let params = params.split_whitespace().collect::<Vec<_>>().join(" ");
            out.push((start, name, params));
        }
    }
    out
}

/// A `#define NAME(args) body` line: (name, args, body).
fn macro_def(line: &str) -> Option<(&str, Vec<&str>, &str)> {
    let rest = line.trim_start().strip_prefix("#define")?.trim_start();
    let n = ident_len(rest);
    let (args, body) = balanced(&rest[n..])?;
    Some((
        &rest[..n],
        args.split(',').map(str::trim).collect(),
        body.trim(),
    ))
}

/// The first argument of each `X(...)` entry of a type list's body.
fn list_entries(body: &str, x: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find(x) {
        let after = &rest[at + x.len()..];
        let standalone =
            at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        match balanced(after.trim_start()) {
            Some((args, tail)) if standalone => {
                if let Some(first) = args.split(',').next() {
                    out.push(first.trim().to_string());
                }
                rest = tail;
            }
            _ => rest = after,
        }
    }
    out
}

/// Every kernel the text defines, in the order the preprocessor would produce them.
pub fn declarations(text: &str) -> Vec<KernelDecl> {
    let lines = logical_lines(text);
    // Families (macros that define kernels) and type lists (one-argument macros of entries).
    // (macro, its type parameter, the kernels it defines).
    let mut families: Vec<(String, String, Vec<Definition>)> = Vec::new();
    let mut lists: Vec<(String, Vec<String>)> = Vec::new();
    for l in &lines {
        let Some((name, args, body)) = macro_def(l) else {
            continue;
        };
        if body.contains(KERNEL) {
            let param = args.first().copied().unwrap_or("").to_string();
            families.push((name.to_string(), param, definitions(body)));
        } else if args.len() == 1 && !args[0].is_empty() {
            lists.push((name.to_string(), list_entries(body, args[0])));
        }
    }
    // The code outside directives, one logical line a line (a signature may span lines), and
    // what each application of a family to a list defines, at its offset there.
    let mut code = String::new();
    let mut found: Vec<(usize, KernelDecl)> = Vec::new();
    for l in &lines {
        let at = code.len();
        let t = l.trim_start();
        if !t.starts_with('#') {
            code.push_str(l);
        }
        code.push('\n');
        let n = ident_len(t);
        if n > 0
            && let Some((arg, tail)) = balanced(&t[n..])
            && tail.trim().is_empty()
            && let Some((_, types)) = lists.iter().find(|(name, _)| *name == t[..n])
            && let Some((_, param, defs)) = families.iter().find(|(f, ..)| f == arg.trim())
        {
            for ty in types {
                for (_, name, params) in defs {
                    let name = name.replace(&format!("##{param}"), ty).replace("##", "");
                    found.push((
                        at,
                        KernelDecl {
                            name,
                            params: params.clone(),
                        },
                    ));
                }
            }
        }
    }
    for (at, name, params) in definitions(&code) {
        if !name.contains("##") {
            found.push((at, KernelDecl { name, params }));
        }
    }
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, d)| d).collect()
}

/// The names of the kernels the text defines.
pub fn kernel_names(text: &str) -> Vec<String> {
    declarations(text).into_iter().map(|d| d.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_kernels_and_families_over_type_lists() {
        let text = "\
#define LIST(X) X(q4_0, 32, 18) X(q8_0, 32, 34)
#define EMPTY(X)
#define FAM(T, BL, BB)                                    \\
    HS_KERNEL void hs_a_##T(HS_TRACK_PARAMS, const float *x, \\
                            hs_u32 n) { body<BL>(); }     \\
    HS_KERNEL void hs_b_##T(HS_TRACK_PARAMS) {}
HS_KERNEL void  plain (HS_TRACK_PARAMS, float *y) {}
LIST(FAM)
EMPTY(FAM)
// A mention of HS_KERNEL void foo without its parameter list is no kernel.
";
        let d = declarations(text);
        let names: Vec<&str> = d.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(
            names,
            ["plain", "hs_a_q4_0", "hs_b_q4_0", "hs_a_q8_0", "hs_b_q8_0",]
        );
        assert_eq!(d[1].params, "HS_TRACK_PARAMS, const float *x, hs_u32 n");
        assert_eq!(d[0].params, "HS_TRACK_PARAMS, float *y");
        assert!(kernel_names("// no kernels").is_empty());
    }
}
