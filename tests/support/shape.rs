//! The size rule both crates' layering tests keep (`apiserver/tests/layering.rs`,
//! `store/tests/layering.rs`): no function over [`MAX_FN_LINES`] lines and no file over
//! [`MAX_FILE_LINES`], counting code outside tests. A function is counted from its `fn` line to
//! its closing brace; comments, strings and character literals are blanked first so their braces
//! do not count; `#[cfg(test)]` modules and `tests.rs` files are skipped.

use std::path::{Path, PathBuf};

/// A function longer than this reads as more than one step: split it into named ones.
pub const MAX_FN_LINES: usize = 80;
/// A file longer than this holds more than one job: split it into modules.
pub const MAX_FILE_LINES: usize = 600;

/// Every `.rs` file under `dir` that is not a test file.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
            out.push(path);
        }
    }
}

/// `src` with comments, string literals and character literals replaced by spaces (newlines kept),
/// so that only code's braces remain.
fn blank_non_code(src: &str) -> Vec<u8> {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if b[i..].starts_with(b"//") {
            let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !ident_before
            && (b[i..].starts_with(b"r#") || b[i..].starts_with(b"r\"") || b[i..].starts_with(b"br"))
        {
            // a raw string: r"..", r#".."#, br#".."#
            let start = i + usize::from(b[i] == b'b') + 1;
            let hashes = b[start..].iter().take_while(|&&c| c == b'#').count();
            if b.get(start + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let body = start + hashes + 1;
            let end = b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| body + p + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // a character literal ('x', '\n', '\u{..}'), not a lifetime ('a)
            let len = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            match len {
                Some(len) => {
                    blank(&mut out, i, i + len);
                    i += len;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The index of the brace closing the one at `open`.
fn closing(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    code.len()
}

fn lines_in(code: &[u8]) -> usize {
    code.iter().filter(|&&c| c == b'\n').count()
}

/// Whether `code[at..]` starts the word `word` (not inside a longer identifier).
fn word_at(code: &[u8], at: usize, word: &[u8]) -> bool {
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    code[at..].starts_with(word)
        && (at == 0 || !ident(code[at - 1]))
        && code.get(at + word.len()).is_none_or(|&c| !ident(c))
}

/// The `(start, end)` byte spans of the `#[cfg(test)] mod x { .. }` blocks in `code`.
fn test_modules(code: &[u8]) -> Vec<(usize, usize)> {
    let marker = b"#[cfg(test)]";
    let mut spans = Vec::new();
    let mut at = 0;
    while let Some(p) = code[at..].windows(marker.len()).position(|w| w == marker) {
        let start = at + p;
        let mut j = start + marker.len();
        while j < code.len() && code[j].is_ascii_whitespace() {
            j += 1;
        }
        if word_at(code, j, b"mod") || word_at(code, j, b"pub") {
            let end = code[j..]
                .iter()
                .position(|&c| c == b'{' || c == b';')
                .map_or(code.len(), |p| j + p);
            spans.push((
                start,
                if code.get(end) == Some(&b'{') {
                    closing(code, end)
                } else {
                    end
                },
            ));
        }
        at = start + marker.len();
    }
    spans
}

/// What breaks the size rule under `dir`: `"<file>:<line> fn <name>: <n> lines"` for each long
/// function and `"<file>: <n> lines"` for each long file.
fn oversized(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(dir, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = blank_non_code(&text);
        let tests = test_modules(&code);
        let in_tests = |p: usize| tests.iter().any(|&(a, b)| (a..=b).contains(&p));
        let name = file.strip_prefix(dir).unwrap().display().to_string();
        let test_lines: usize = tests.iter().map(|&(a, b)| lines_in(&code[a..b.min(code.len())])).sum();
        let file_lines = lines_in(&code) - test_lines;
        if file_lines > MAX_FILE_LINES {
            found.push(format!("{name}: {file_lines} lines"));
        }
        for at in 0..code.len() {
            if !word_at(&code, at, b"fn") || in_tests(at) {
                continue;
            }
            // `fn(..) -> ..` is a function pointer type, not a function
            if code[at + 2..].iter().find(|c| !c.is_ascii_whitespace()) == Some(&b'(') {
                continue;
            }
            // the body's brace: the first `{` after the signature, outside its parentheses,
            // generics and brackets; a `;` first means a declaration without a body
            let mut depth = 0i32;
            let mut open = None;
            for (j, &c) in code.iter().enumerate().skip(at + 2) {
                match c {
                    b'(' | b'[' | b'<' => depth += 1,
                    b')' | b']' => depth -= 1,
                    b'>' if code[j - 1] != b'-' && code[j - 1] != b'=' => depth -= 1,
                    b';' if depth <= 0 => break,
                    b'{' if depth <= 0 => {
                        open = Some(j);
                        break;
                    }
                    _ => {}
                }
            }
            let Some(open) = open else { continue };
            let lines = lines_in(&code[at..closing(&code, open)]) + 1;
            if lines > MAX_FN_LINES {
                let fn_name: String = text[at + 2..]
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                found.push(format!(
                    "{name}:{} fn {fn_name}: {lines} lines",
                    lines_in(&code[..at]) + 1
                ));
            }
        }
    }
    found
}

/// Fails the test with every function and file under `dir` that breaks the size rule.
pub fn assert_within_limits(dir: &Path) {
    let oversized = oversized(dir);
    assert!(
        oversized.is_empty(),
        "split these into named steps or modules:\n{}",
        oversized.join("\n")
    );
}
