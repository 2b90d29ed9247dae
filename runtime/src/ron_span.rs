//! Where a key path sits in RON text, so that errors found after parsing (a
//! value out of range, a schedule that does not check) name
//! `file:line:column` like the parser's own syntax errors do.
//!
//! The locator tokenizes the text, skipping comments, strings and char
//! literals, and follows a path such as `schedule.phases[1].options.pow2`
//! through structs, maps, tuples, lists and wrappers like `Some(..)`. It
//! never panics: where it cannot follow the whole path it reports the
//! deepest part it found, else the start of the text.

/// A 1-based line and column; columns count characters, and a tab is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column, in characters (a tab counts as one).
    pub column: usize,
}

/// RON text and the name errors give it.
#[derive(Clone, Copy, Debug)]
pub struct RonSource<'a> {
    origin: &'a str,
    /// A file or preset name (`origin:line:column`) rather than a description
    /// (`origin, line L, column C`).
    named: bool,
    text: &'a str,
}

impl<'a> RonSource<'a> {
    /// Text read from `origin`, a file path or preset name: places print as
    /// `origin:line:column`.
    pub fn named(origin: &'a str, text: &'a str) -> Self {
        RonSource {
            origin,
            named: true,
            text,
        }
    }

    /// Text that came without a file name; `what` describes it ("schedule
    /// config"), and places print as `what, line L, column C`.
    pub fn unnamed(what: &'a str, text: &'a str) -> Self {
        RonSource {
            origin: what,
            named: false,
            text,
        }
    }

    /// The RON text itself.
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// Where the key or element `path` is, exactly; `None` if it is not in the text.
    pub fn find(&self, path: &str) -> Option<Position> {
        match walk(&tokenize(self.text), path) {
            (true, pos) => pos,
            (false, _) => None,
        }
    }

    /// Where `path` is, or else the deepest part of it in the text (a key
    /// left at its default points at its struct), or else the text's start.
    pub fn position(&self, path: &str) -> Position {
        walk(&tokenize(self.text), path)
            .1
            .unwrap_or(Position { line: 1, column: 1 })
    }

    /// `origin:line:column` of `path`.
    pub fn place(&self, path: &str) -> String {
        self.place_of(self.position(path))
    }

    /// `origin:line:column` of `pos` (for the parser's own positions too).
    pub fn place_of(&self, pos: Position) -> String {
        if self.named {
            format!("{}:{}:{}", self.origin, pos.line, pos.column)
        } else {
            format!("{}, line {}, column {}", self.origin, pos.line, pos.column)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Open(char),
    Close,
    Colon,
    Comma,
    /// An identifier, number, char literal or anything else between separators.
    Word,
    /// A string; the token's text is its content without quotes.
    Str,
}

#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    kind: Kind,
    text: &'a str,
    pos: Position,
}

/// Characters with their byte offsets, and where the cursor is.
struct Cursor<'a> {
    text: &'a str,
    chars: Vec<(usize, char)>,
    i: usize,
    pos: Position,
}

impl<'a> Cursor<'a> {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).map(|&(_, c)| c)
    }

    fn offset(&self) -> usize {
        self.chars.get(self.i).map_or(self.text.len(), |&(o, _)| o)
    }

    fn bump(&mut self) {
        if let Some(&(_, c)) = self.chars.get(self.i) {
            self.i += 1;
            if c == '\n' {
                self.pos.line += 1;
                self.pos.column = 1;
            } else {
                self.pos.column += 1;
            }
        }
    }

    /// From an opening `quote`, past the closing one (backslash escapes);
    /// returns the content. An unclosed string runs to the end.
    fn quoted(&mut self, quote: char) -> &'a str {
        self.bump();
        let start = self.offset();
        while let Some(c) = self.peek(0) {
            if c == quote {
                let end = self.offset();
                self.bump();
                return &self.text[start..end];
            }
            if c == '\\' {
                self.bump();
            }
            self.bump();
        }
        &self.text[start..]
    }

    /// A raw string `r#"..."#` (optionally `br`) starting here: the number
    /// of characters before its opening quote, and its `#` count.
    fn raw_string_start(&self) -> Option<(usize, usize)> {
        let mut k = usize::from(self.peek(0) == Some('b'));
        if self.peek(k) != Some('r') {
            return None;
        }
        k += 1;
        let hashes_from = k;
        while self.peek(k) == Some('#') {
            k += 1;
        }
        (self.peek(k) == Some('"')).then_some((k, k - hashes_from))
    }

    /// Past a raw string whose opening quote is `lead` characters ahead.
    fn raw_string(&mut self, lead: usize, hashes: usize) -> &'a str {
        for _ in 0..=lead {
            self.bump();
        }
        let start = self.offset();
        while let Some(c) = self.peek(0) {
            if c == '"' && (1..=hashes).all(|h| self.peek(h) == Some('#')) {
                let end = self.offset();
                for _ in 0..=hashes {
                    self.bump();
                }
                return &self.text[start..end];
            }
            self.bump();
        }
        &self.text[start..]
    }

    /// Past a `/* */` comment; they nest, as in RON.
    fn block_comment(&mut self) {
        self.bump();
        self.bump();
        let mut depth = 1usize;
        while depth > 0 {
            match (self.peek(0), self.peek(1)) {
                (None, _) => return,
                (Some('/'), Some('*')) => {
                    depth += 1;
                    self.bump();
                }
                (Some('*'), Some('/')) => {
                    depth -= 1;
                    self.bump();
                }
                _ => {}
            }
            self.bump();
        }
    }

    fn starts_comment(&self) -> bool {
        self.peek(0) == Some('/') && matches!(self.peek(1), Some('/' | '*'))
    }
}

fn is_separator(c: char) -> bool {
    c.is_whitespace() || "()[]{}:,\"'".contains(c)
}

fn tokenize(text: &str) -> Vec<Token<'_>> {
    let mut cur = Cursor {
        text,
        chars: text.char_indices().collect(),
        i: 0,
        pos: Position { line: 1, column: 1 },
    };
    let mut toks = Vec::new();
    while let Some(c) = cur.peek(0) {
        let pos = cur.pos;
        let start = cur.offset();
        let mut push = |kind, text| toks.push(Token { kind, text, pos });
        if c.is_whitespace() {
            cur.bump();
        } else if cur.starts_comment() {
            if cur.peek(1) == Some('/') {
                while cur.peek(0).is_some_and(|c| c != '\n') {
                    cur.bump();
                }
            } else {
                cur.block_comment();
            }
        } else if "([{".contains(c) {
            cur.bump();
            push(Kind::Open(c), "");
        } else if ")]}".contains(c) {
            cur.bump();
            push(Kind::Close, "");
        } else if c == ':' || c == ',' {
            cur.bump();
            push(if c == ':' { Kind::Colon } else { Kind::Comma }, "");
        } else if c == '"' {
            push(Kind::Str, cur.quoted('"'));
        } else if c == '\'' {
            cur.quoted('\'');
            push(Kind::Word, &text[start..cur.offset()]);
        } else if let Some((lead, hashes)) = cur.raw_string_start() {
            push(Kind::Str, cur.raw_string(lead, hashes));
        } else if c == 'b' && cur.peek(1) == Some('"') {
            cur.bump();
            push(Kind::Str, cur.quoted('"'));
        } else {
            cur.bump();
            while cur.peek(0).is_some_and(|c| !is_separator(c)) && !cur.starts_comment() {
                cur.bump();
            }
            push(Kind::Word, &text[start..cur.offset()]);
        }
    }
    toks
}

/// One step of a key path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seg<'p> {
    Key(&'p str),
    Index(usize),
}

/// `a.b[1].c` as segments; `None` for a malformed path. The empty path is the root.
fn parse_path(path: &str) -> Option<Vec<Seg<'_>>> {
    let mut segs = Vec::new();
    if path.is_empty() {
        return Some(segs);
    }
    for part in path.split('.') {
        let (name, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        if name.is_empty() && rest.is_empty() {
            return None;
        }
        if !name.is_empty() {
            segs.push(Seg::Key(name));
        }
        while let Some(inner) = rest.strip_prefix('[') {
            let close = inner.find(']')?;
            segs.push(Seg::Index(inner[..close].parse().ok()?));
            rest = &inner[close + 1..];
        }
        if !rest.is_empty() {
            return None;
        }
    }
    Some(segs)
}

/// How many wrappers (`Some(..)`, newtypes) a lookup looks through.
const MAX_WRAPPERS: usize = 8;

/// Follows `path` through `toks`: whether all of it was found, and the
/// position of the deepest part that was.
fn walk(toks: &[Token<'_>], path: &str) -> (bool, Option<Position>) {
    let w = Walker { toks };
    let mut i = w.root();
    let mut found = toks.get(i).map(|t| t.pos);
    let Some(segs) = parse_path(path) else {
        return (false, found);
    };
    for seg in segs {
        let next = match seg {
            Seg::Key(key) => w.field(i, key),
            Seg::Index(n) => w.element(i, n).map(|e| (e, e)),
        };
        let Some((at, value)) = next else {
            return (false, found);
        };
        found = toks.get(at).map(|t| t.pos).or(found);
        i = value;
    }
    (true, found)
}

struct Walker<'t, 'a> {
    toks: &'t [Token<'a>],
}

impl Walker<'_, '_> {
    fn kind(&self, i: usize) -> Option<Kind> {
        self.toks.get(i).map(|t| t.kind)
    }

    /// The first token of the root value, past `#![enable(..)]` attributes.
    fn root(&self) -> usize {
        let mut i = 0;
        while let Some(t) = self.toks.get(i) {
            if t.kind != Kind::Word || !t.text.starts_with('#') {
                break;
            }
            i += 1;
            if matches!(self.kind(i), Some(Kind::Open(_))) {
                i = self.skip_group(i);
            }
        }
        i
    }

    /// Just past the bracket group opening at `i`.
    fn skip_group(&self, mut i: usize) -> usize {
        let mut depth = 0usize;
        while let Some(kind) = self.kind(i) {
            i += 1;
            match kind {
                Kind::Open(_) => depth += 1,
                Kind::Close => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
        i
    }

    /// The `,` or closing bracket that ends the entry starting at `i`.
    fn skip_entry(&self, mut i: usize) -> usize {
        loop {
            match self.kind(i) {
                None | Some(Kind::Comma | Kind::Close) => return i,
                Some(Kind::Open(_)) => i = self.skip_group(i),
                Some(_) => i += 1,
            }
        }
    }

    /// The first token of each entry of the group opening at `open`.
    fn entries(&self, open: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut j = open + 1;
        while !matches!(self.kind(j), None | Some(Kind::Close)) {
            out.push(j);
            j = self.skip_entry(j);
            if self.kind(j) != Some(Kind::Comma) {
                break;
            }
            j += 1;
        }
        out
    }

    /// The group a value at `i` opens, past a struct name or `Some`.
    fn group(&self, i: usize, brackets: &str) -> Option<usize> {
        let open = match self.kind(i)? {
            Kind::Word => i + 1,
            _ => i,
        };
        match self.kind(open)? {
            Kind::Open(c) if brackets.contains(c) => Some(open),
            _ => None,
        }
    }

    /// A wrapper with one unnamed entry, such as `Some((..))`: that entry.
    fn unwrap(&self, open: usize) -> Option<usize> {
        let entries = self.entries(open);
        match entries[..] {
            [only] if self.kind(only + 1) != Some(Kind::Colon) => Some(only),
            _ => None,
        }
    }

    /// Field `key` of the struct or map at `i`: (its key token, its value).
    fn field(&self, mut i: usize, key: &str) -> Option<(usize, usize)> {
        for _ in 0..MAX_WRAPPERS {
            let open = self.group(i, "({")?;
            for e in self.entries(open) {
                let t = self.toks.get(e)?;
                let name = t.text.strip_prefix("r#").unwrap_or(t.text);
                let is_key = matches!(t.kind, Kind::Word | Kind::Str)
                    && self.kind(e + 1) == Some(Kind::Colon);
                if is_key && name == key {
                    return Some((e, e + 2));
                }
            }
            i = self.unwrap(open)?;
        }
        None
    }

    /// Element `n` of the list or tuple at `i`.
    fn element(&self, mut i: usize, n: usize) -> Option<usize> {
        for _ in 0..MAX_WRAPPERS {
            let open = self.group(i, "([")?;
            let entries = self.entries(open);
            match entries[..] {
                // `Some([..])`: look inside the wrapper.
                [only]
                    if self.kind(i) == Some(Kind::Word)
                        && matches!(self.kind(only), Some(Kind::Open(_))) =>
                {
                    i = only
                }
                _ => return entries.get(n).copied(),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = r##"#![enable(implicit_some)]
// model: (mlp_ratio: 1.0) in a comment
RunConfig(
    model: (
        hidden_size: 64, /* mlp_ratio: /* nested */ 2.0 */
        mlp_ratio: NaN,
        axes_dim: [4, 6, 6],
        label: "mlp_ratio: 3.0",
        raw: r#"x: "y")"#,
        ch: ')',
    ),
    schedule: (
        phases: [(start: 0, recipe: "mxfp4"),
            (start: 12000, recipe: "fp8", options: Some((pow2: true)))],
    ),
    map: {"key": [1, 2]},
)
"##;

    fn at(path: &str) -> Option<(usize, usize)> {
        RonSource::named("f.ron", RUN)
            .find(path)
            .map(|p| (p.line, p.column))
    }

    #[test]
    fn finds_keys_elements_and_nested_paths() {
        assert_eq!(at("model"), Some((4, 5)));
        assert_eq!(at("model.mlp_ratio"), Some((6, 9)));
        assert_eq!(at("model.axes_dim[2]"), Some((7, 26)));
        assert_eq!(at("model.ch"), Some((10, 9)));
        assert_eq!(at("schedule.phases[0].start"), Some((13, 19)));
        assert_eq!(at("schedule.phases[1]"), Some((14, 13)));
        assert_eq!(at("schedule.phases[1].recipe"), Some((14, 28)));
        assert_eq!(at("schedule.phases[1].options.pow2"), Some((14, 58)));
        assert_eq!(at("map.key[1]"), Some((16, 22)));
        assert_eq!(at(""), Some((3, 1)));
    }

    #[test]
    fn comments_and_strings_hide_nothing_and_fake_nothing() {
        // The only real `label` and `raw` keys; the quoted and commented
        // `mlp_ratio`s are not keys.
        assert_eq!(at("model.label"), Some((8, 9)));
        assert_eq!(at("model.raw"), Some((9, 9)));
        assert_eq!(at("model.x"), None);
        let text = "( /* a: 1 */ b: \"a: 2\", // a: 3\n a: 4)";
        let p = RonSource::named("t", text).find("a").unwrap();
        assert_eq!((p.line, p.column), (2, 2));
    }

    #[test]
    fn a_missing_part_falls_back_to_what_was_found() {
        let src = RonSource::named("f.ron", RUN);
        assert_eq!(src.find("schedule.order"), None);
        assert_eq!(src.place("schedule.order"), "f.ron:12:5");
        assert_eq!(src.place("schedule.phases[5].start"), "f.ron:13:9");
        assert_eq!(src.place("model.axes_dim[3]"), "f.ron:7:9");
        assert_eq!(src.place("not a [path"), "f.ron:3:1");
        assert_eq!(
            RonSource::unnamed("schedule config", "(\n a: 1)").place("a"),
            "schedule config, line 2, column 2"
        );
        assert_eq!(RonSource::named("e", "").place("a.b"), "e:1:1");
    }

    #[test]
    fn columns_count_characters() {
        let p = RonSource::named("u", "(\"é\u{1F600}\": 1, b: 2)").find("b");
        assert_eq!(
            p,
            Some(Position {
                line: 1,
                column: 11
            })
        );
    }

    #[test]
    fn paths_parse_or_are_rejected() {
        use Seg::*;
        assert_eq!(
            parse_path("a.b[1][2].c"),
            Some(vec![Key("a"), Key("b"), Index(1), Index(2), Key("c")])
        );
        for bad in ["a..b", "a[", "a[x]", "a[1]b", ".a", "a."] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
    }

    /// Every prefix of real configs, and odd text, is located without a panic.
    #[test]
    fn never_panics() {
        let paths = [
            "model.mlp_ratio",
            "schedule.phases[1].options.pow2",
            "model.axes_dim[2]",
            "a[0][0]",
            "",
        ];
        let mut texts: Vec<String> = Vec::new();
        for cut in RUN.char_indices().map(|(i, _)| i) {
            texts.push(RUN[..cut].to_string());
            texts.push(RUN[cut..].to_string());
        }
        let odd =
            r###""|'|r#"|/*|/* /*|b"|br##"x"#|)))|(((|(a:|:::,,,|([{)]}|#!|#![|Some(|a: (|é|r|\"###;
        texts.extend(odd.split('|').map(String::from));
        texts.push("[".repeat(10_000));
        texts.push("Some(".repeat(100) + "(a: 1)" + &")".repeat(100));
        for text in &texts {
            let src = RonSource::named("x", text);
            for path in paths {
                let _ = src.find(path);
                let _ = src.place(path);
            }
        }
    }
}
