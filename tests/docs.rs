//! The documentation's shape: README.md stays a page read in five minutes, and no relative link in
//! the repository's markdown (README.md, docs/, the other READMEs) points at nothing: every linked
//! file exists inside the repository, and every `#anchor` into a markdown file names one of its
//! headings, as GitHub makes anchors of them. And the pages that list the tools list the tools
//! there are: README.md's table, docs/tools.md's index and sections, docs/security.md's
//! `--read-only` sets, each as the tools' own declarations say.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 250;

#[test]
fn the_readme_is_read_in_five_minutes() {
    let readme = fs::read_to_string(repository().join("README.md")).expect("README.md reads");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into docs/ and link to it"
    );
}

/// docs/cli.md opens with `swank-mcp --help` as the binary prints it: a hand copy drifts.
#[test]
fn the_command_line_page_shows_the_help_the_binary_prints() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_swank-mcp"))
        .arg("--help")
        .env_remove("SWANK_MCP_HOST")
        .env_remove("SWANK_MCP_PORT")
        .output()
        .expect("swank-mcp runs");
    let help = String::from_utf8(output.stdout).expect("the help is UTF-8");
    let page = fs::read_to_string(repository().join("docs/cli.md")).expect("docs/cli.md reads");
    let fence = "```\n";
    let start = page.find(fence).expect("docs/cli.md has a code block") + fence.len();
    let end = start + page[start..].find(fence).expect("its code block is closed");
    assert_eq!(
        &page[start..end],
        help,
        "docs/cli.md's first code block is not what `swank-mcp --help` prints: paste the output in"
    );
}

#[test]
fn every_relative_link_in_the_documentation_leads_somewhere() {
    let root = repository();
    let documents = markdown_files(&root);
    assert!(documents.iter().any(|path| path.starts_with(root.join("docs"))), "docs/ holds markdown files");
    let broken = broken_links(&root, &documents);
    assert!(broken.is_empty(), "links that point at nothing:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_finds_a_missing_file_a_missing_heading_and_a_way_out_of_the_repository() {
    let outside = tempfile::tempdir().expect("a temporary directory");
    let root = outside.path().join("repository");
    fs::create_dir_all(root.join("docs")).unwrap();
    fs::write(outside.path().join("beside.md"), "# Beside\n").unwrap();
    fs::write(
        root.join("docs/guide.md"),
        "# Guide\n\n## Approving calls: `--confirm`\n\n## Approving calls: `--confirm`\n\n\
         ```\n## not a heading\n```\n",
    )
    .unwrap();
    fs::write(
        root.join("README.md"),
        "# Title\n\n\
         [fine](docs/guide.md#approving-calls---confirm), [second](docs/guide.md#approving-calls---confirm-1),\n\
         [here](#title), [web](https://example.com/x#y), `[code](nowhere.md)`\n\n\
         [no file](docs/missing.md) and [no heading](docs/guide.md#not-a-heading)\n\n\
         [out](../beside.md)\n\n\
         ```\n[fenced](nowhere.md)\n```\n",
    )
    .unwrap();
    let broken = broken_links(&root, &markdown_files(&root));
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("README.md:6: docs/missing.md"), "{broken:#?}");
    assert!(broken[1].contains("README.md:6: docs/guide.md#not-a-heading"), "{broken:#?}");
    assert!(broken[2].contains("README.md:8: ../beside.md"), "{broken:#?}");
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(anchor("Approving calls: `--confirm`"), "approving-calls---confirm");
    assert_eq!(anchor("The helper's footprint in your image"), "the-helpers-footprint-in-your-image");
    assert_eq!(anchor("Watching: `M-x swank-mcp-activity`"), "watching-m-x-swank-mcp-activity");
    assert_eq!(anchor("The loop: edit, load, run"), "the-loop-edit-load-run");
    assert_eq!(anchor("[Linked](x.md) *and* snake_case"), "linked-and-snake_case");
}

/// What the documentation must say of a tool, from its declaration.
struct ToolFacts {
    name: &'static str,
    read_only: bool,
    arguments: Vec<&'static str>,
}

fn declared_tools() -> Vec<ToolFacts> {
    swank_mcp::tools::every_definition()
        .map(|definition| ToolFacts {
            name: definition.name,
            read_only: definition.read_only,
            arguments: definition.arguments.iter().map(|param| param.name()).collect(),
        })
        .collect()
}

#[test]
fn the_pages_that_list_the_tools_list_every_tool_as_declared() {
    let root = repository();
    let read = |path: &str| fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path} reads: {e}"));
    let gaps = tool_documentation_gaps(
        &declared_tools(),
        &read("README.md"),
        &read("docs/tools.md"),
        &read("docs/security.md"),
    );
    assert!(gaps.is_empty(), "the documentation disagrees with the tools' declarations:\n{}", gaps.join("\n"));
}

#[test]
fn the_tool_check_finds_a_tool_left_out_of_each_page_and_a_wrong_count() {
    let tools = |extra: bool| {
        let mut tools = vec![
            ToolFacts { name: "look-up", read_only: true, arguments: vec!["symbol", "package"] },
            ToolFacts { name: "run-it", read_only: false, arguments: vec!["code"] },
        ];
        if extra {
            tools.push(ToolFacts { name: "new-tool", read_only: true, arguments: vec!["depth"] });
        }
        tools
    };
    let readme = "## Tools\n\n| tool | what it does | `--read-only` |\n| --- | --- | --- |\n\
                  | [look-up](docs/tools.md#look-up) | looks | offered |\n\
                  | [run-it](docs/tools.md#running) | runs | left out |\n\n\
                  | `--read-only` | Only the one tool above that takes no code. |\n";
    let tools_md = "# The tools\n\nEach of swank-mcp's 2 tools.\n\n- [look-up](#look-up)\n- [Running](#running) \
                    (`run-it`)\n\n## look-up\n\n`{symbol, package?}` Looks.\n\n## Running\n\n`{code}` Runs.\n";
    let security = "## `--read-only`\n\n`--read-only` offers only the one tool that takes no Lisp code: \
                    `look-up`. It leaves out `run-it`.\n";
    assert_eq!(tool_documentation_gaps(&tools(false), readme, tools_md, security), Vec::<String>::new());
    let gaps = tool_documentation_gaps(&tools(true), readme, tools_md, security);
    let expected = [
        "README.md: the tools table has no row for new-tool",
        "README.md: the --read-only row says one tool, but 2 are read-only",
        "docs/tools.md: says 2 tools, but there are 3",
        "docs/tools.md: the index does not name new-tool",
        "docs/security.md: says one read-only tool, but there are 2",
        "docs/security.md: the --read-only paragraph does not name new-tool among the tools it offers",
    ];
    assert_eq!(gaps, expected);
    let renamed = tools_md.replace("`{symbol, package?}`", "`{symbol}`");
    let gaps = tool_documentation_gaps(&tools(false), readme, &renamed, security);
    assert_eq!(gaps, ["docs/tools.md#look-up: the section does not name argument `package` of look-up"]);
    let moved = readme.replace("| looks | offered |", "| looks | left out |");
    let gaps = tool_documentation_gaps(&tools(false), &moved, tools_md, security);
    assert_eq!(gaps, ["README.md: the row of look-up says \"left out\" under --read-only, but it is read-only"]);
}

/// Where README.md, docs/tools.md and docs/security.md disagree with `tools`, one line each.
fn tool_documentation_gaps(tools: &[ToolFacts], readme: &str, tools_md: &str, security: &str) -> Vec<String> {
    let mut gaps = Vec::new();
    let read_only: Vec<&str> = tools.iter().filter(|tool| tool.read_only).map(|tool| tool.name).collect();
    let all: Vec<&str> = tools.iter().map(|tool| tool.name).collect();

    // README.md: a row `| [name](docs/tools.md#anchor) | what | offered or left out |` per tool.
    let mut anchors = HashMap::new();
    for line in readme.lines().filter(|line| line.starts_with("| [")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        let Some((name, target)) = cells[0].strip_prefix('[').and_then(|cell| cell.split_once("](")) else { continue };
        let Some(tool) = tools.iter().find(|tool| tool.name == name) else {
            gaps.push(format!("README.md: the tools table has a row for {name}, which is no tool"));
            continue;
        };
        let offered = if tool.read_only { "offered" } else { "left out" };
        if cells.last() != Some(&offered) {
            let said = cells.last().unwrap_or(&"");
            let is = if tool.read_only { "it is read-only" } else { "it is not read-only" };
            gaps.push(format!("README.md: the row of {name} says {said:?} under --read-only, but {is}"));
        }
        if let Some(anchor) = target.trim_end_matches(')').strip_prefix("docs/tools.md#") {
            anchors.insert(name.to_string(), anchor.to_string());
        }
    }
    for name in &all {
        if !anchors.contains_key(*name) {
            gaps.push(format!("README.md: the tools table has no row for {name}"));
        }
    }
    match readme.lines().find(|line| line.starts_with("| `--read-only` |")).map(|row| counted(row, "Only the ")) {
        Some(Some(count)) if count == read_only.len() => {}
        Some(Some(count)) => gaps.push(format!(
            "README.md: the --read-only row says {} tool{}, but {} are read-only",
            number_word(count),
            if count == 1 { "" } else { "s" },
            read_only.len()
        )),
        _ => gaps.push("README.md: no --read-only row saying \"Only the N tools\"".into()),
    }

    // docs/tools.md: the count, the index (before the first section) and a section per tool that
    // names each of its arguments in code.
    match counted(tools_md, "Each of swank-mcp's ") {
        Some(count) if count == all.len() => {}
        Some(count) => gaps.push(format!("docs/tools.md: says {count} tools, but there are {}", all.len())),
        None => gaps.push("docs/tools.md: does not say \"Each of swank-mcp's N tools\"".into()),
    }
    let index = tools_md.split("\n## ").next().unwrap_or("");
    for name in &all {
        if !index.contains(&format!("[{name}](#")) && !index.contains(&format!("`{name}`")) {
            gaps.push(format!("docs/tools.md: the index does not name {name}"));
        }
    }
    for tool in tools {
        let Some(anchor) = anchors.get(tool.name) else { continue };
        let Some(section) = section(tools_md, anchor) else {
            gaps.push(format!("docs/tools.md: no heading has the anchor #{anchor} README.md links {} to", tool.name));
            continue;
        };
        let spans = code_spans(&section);
        let named: BTreeSet<&str> = spans
            .iter()
            .flat_map(|span| span.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-')))
            .collect();
        for argument in &tool.arguments {
            if !named.contains(argument) {
                gaps.push(format!(
                    "docs/tools.md#{anchor}: the section does not name argument `{argument}` of {}",
                    tool.name
                ));
            }
        }
    }

    // docs/security.md: "`--read-only` offers only the N tools ...: `a`, `b`. It leaves out `c`."
    let paragraph =
        security.split("\n\n").find(|paragraph| paragraph.starts_with("`--read-only` offers only the ")).unwrap_or("");
    match counted(paragraph, "offers only the ") {
        Some(count) if count == read_only.len() => {}
        Some(count) => gaps.push(format!(
            "docs/security.md: says {} read-only tool{}, but there are {}",
            number_word(count),
            if count == 1 { "" } else { "s" },
            read_only.len()
        )),
        None => gaps.push("docs/security.md: no paragraph \"`--read-only` offers only the N tools\"".into()),
    }
    let (offered, left_out) = paragraph.split_once("It leaves out").unwrap_or((paragraph, ""));
    for (part, names, what) in [(offered, &read_only, "offers"), (left_out, &all, "leaves out")] {
        let listed: Vec<String> = code_spans(part).into_iter().filter(|span| !span.starts_with("--")).collect();
        for name in names.iter().filter(|name| what == "offers" || !read_only.contains(name)) {
            if !listed.iter().any(|span| span == name) {
                gaps.push(format!(
                    "docs/security.md: the --read-only paragraph does not name {name} among the tools it {what}"
                ));
            }
        }
        for span in &listed {
            let belongs = if what == "offers" {
                read_only.contains(&span.as_str())
            } else {
                all.contains(&span.as_str()) && !read_only.contains(&span.as_str())
            };
            if !belongs {
                gaps.push(format!(
                    "docs/security.md: the --read-only paragraph says it {what} `{span}`, which it does not"
                ));
            }
        }
    }
    gaps
}

/// The number, in digits or words, that follows `lead` in `text`: 22 in "Each of the 22 tools".
fn counted(text: &str, lead: &str) -> Option<usize> {
    let after = &text[text.find(lead)? + lead.len()..];
    let word = after.split_whitespace().next()?;
    word.parse().ok().or_else(|| (1..=30).find(|n| number_word(*n) == word))
}

fn number_word(n: usize) -> String {
    const WORDS: [&str; 20] = [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
    ];
    WORDS.get(n).map_or_else(|| n.to_string(), |word| word.to_string())
}

/// The text of the section of `markdown` whose heading has `anchor`, up to the next heading of
/// its level or above (its subsections included).
fn section(markdown: &str, anchor: &str) -> Option<String> {
    let lines = prose(markdown);
    let headings = headings(markdown);
    let (position, (start, level, _)) = headings.iter().enumerate().find(|(_, (_, _, found))| found == anchor)?;
    let end = headings[position + 1..].iter().find(|(_, deeper, _)| deeper <= level).map(|(line, _, _)| *line);
    let body: Vec<&str> = lines
        .iter()
        .filter(|(number, _)| number > start && end.is_none_or(|end| *number < end))
        .map(|(_, line)| *line)
        .collect();
    Some(body.join("\n"))
}

/// The contents of the inline code spans of `text`'s prose.
fn code_spans(text: &str) -> Vec<String> {
    let prose: Vec<&str> = prose(text).into_iter().map(|(_, line)| line).collect();
    let joined = prose.join("\n");
    let mut spans = Vec::new();
    let mut rest = joined.as_str();
    while let Some(start) = rest.find('`') {
        let run = rest[start..].chars().take_while(|c| *c == '`').count();
        let fence = &rest[start..start + run];
        let after = &rest[start + run..];
        let Some(end) = after.find(fence) else { break };
        spans.push(after[..end].trim().to_string());
        rest = &after[end + run..];
    }
    spans
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The markdown files of the repository, leaving out build output and hidden directories.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut directories = vec![root.to_path_buf()];
    while let Some(directory) = directories.pop() {
        for entry in fs::read_dir(&directory).expect("the directory reads") {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    directories.push(path);
                }
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Each relative link that leads nowhere, as `FILE:LINE: TARGET: why`.
fn broken_links(root: &Path, documents: &[PathBuf]) -> Vec<String> {
    let root = root.canonicalize().expect("the repository's path resolves");
    let mut headings = HashMap::new();
    let mut broken = Vec::new();
    for document in documents {
        let text = fs::read_to_string(document).expect("the document reads");
        let shown = document.strip_prefix(&root).unwrap_or(document).display().to_string();
        for (line, target) in links(&text) {
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            if let Err(why) = check_link(&root, document, path, fragment, &mut headings) {
                broken.push(format!("{shown}:{line}: {target}: {why}"));
            }
        }
    }
    broken
}

fn check_link(
    root: &Path,
    document: &Path,
    path: &str,
    fragment: &str,
    headings: &mut HashMap<PathBuf, Vec<String>>,
) -> Result<(), String> {
    let target = if path.is_empty() {
        document.to_path_buf()
    } else {
        let joined = document.parent().expect("a document has a directory").join(path);
        let resolved = joined.canonicalize().map_err(|_| "no such file".to_string())?;
        if !resolved.starts_with(root) {
            return Err("outside the repository".into());
        }
        resolved
    };
    if fragment.is_empty() || target.extension().is_none_or(|extension| extension != "md") {
        return Ok(());
    }
    let anchors = headings.entry(target.clone()).or_insert_with(|| {
        let text = fs::read_to_string(&target).unwrap_or_default();
        heading_anchors(&text)
    });
    if anchors.iter().any(|anchor| anchor == fragment) {
        Ok(())
    } else {
        Err(format!("no heading has this anchor (there are: {})", anchors.join(", ")))
    }
}

/// The lines of `text` outside fenced code blocks, with their line numbers from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<(char, usize)> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |c| trimmed.chars().take_while(|d| *d == c).count());
        match (fence, marker) {
            (None, Some(c)) if run >= 3 => fence = Some((c, run)),
            (Some((c, opened)), Some(d)) if c == d && run >= opened && trimmed[run..].trim().is_empty() => fence = None,
            (None, _) => lines.push((index + 1, line)),
            (Some(_), _) => {}
        }
    }
    lines
}

/// The prose with every inline code span blanked out (a span may run over several lines), so
/// that what code spans show is never taken for a link.
fn without_code_spans(prose: &[(usize, &str)]) -> Vec<(usize, String)> {
    let mut open: Option<usize> = None;
    let mut result = Vec::new();
    for (number, line) in prose {
        let mut kept = String::new();
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '`' {
                if open.is_none() {
                    kept.push(c);
                }
                continue;
            }
            let mut run = 1;
            while chars.peek() == Some(&'`') {
                chars.next();
                run += 1;
            }
            open = match open {
                None => Some(run),
                Some(opened) if opened == run => None,
                unchanged => unchanged,
            };
        }
        // A paragraph ends at a blank line, and an unclosed span with it.
        if line.trim().is_empty() {
            open = None;
        }
        result.push((*number, kept));
    }
    result
}

/// The relative targets of inline links and images (`[text](target)`) and of reference
/// definitions (`[label]: target`), with the line each is on.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in without_code_spans(&prose(text)) {
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let target = link_target(after);
            found.push((number, target.to_string()));
            rest = &after[target.len().min(after.len())..];
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            if let Some(end) = trimmed.find("]:") {
                let target = trimmed[end + 2..].split_whitespace().next().unwrap_or("");
                found.push((number, target.to_string()));
            }
        }
    }
    found
        .into_iter()
        .map(|(number, target)| (number, target.trim_start_matches('<').trim_end_matches('>').to_string()))
        .filter(|(_, target)| !target.is_empty() && !has_scheme(target))
        .collect()
}

/// The destination at the start of `after`: up to white space or the `)` that closes the link,
/// parentheses inside it balanced.
fn link_target(after: &str) -> &str {
    let mut depth = 0;
    for (index, c) in after.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return &after[..index],
            ')' => depth -= 1,
            c if c.is_whitespace() => return &after[..index],
            _ => {}
        }
    }
    after
}

fn has_scheme(target: &str) -> bool {
    match target.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        }
        None => false,
    }
}

/// The anchors GitHub gives the ATX headings of a markdown file, in order; a repeated heading
/// gets `-1`, `-2`, ... after the first.
fn heading_anchors(text: &str) -> Vec<String> {
    headings(text).into_iter().map(|(_, _, anchor)| anchor).collect()
}

/// The ATX headings of a markdown file, in order: each one's line number, level and anchor.
fn headings(text: &str) -> Vec<(usize, usize, String)> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = Vec::new();
    for (number, line) in prose(text) {
        let trimmed = line.trim_start();
        let level = trimmed.chars().take_while(|c| *c == '#').count();
        if line.len() - trimmed.len() > 3 || !(1..=6).contains(&level) {
            continue;
        }
        let title = &trimmed[level..];
        if !(title.is_empty() || title.starts_with(' ') || title.starts_with('\t')) {
            continue;
        }
        let title = title.trim().trim_end_matches('#').trim_end();
        let base = anchor(title);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.push((number, level, if *count == 0 { base.clone() } else { format!("{base}-{count}") }));
        *count += 1;
    }
    anchors
}

/// GitHub's anchor of a heading: its text as shown (a link's text, a code span's content),
/// lower case, without punctuation but `-` and `_`, each space a `-`.
fn anchor(title: &str) -> String {
    let mut shown = String::new();
    let mut rest = title;
    while let Some(start) = rest.find('[') {
        let Some(close) = rest[start..].find("](") else { break };
        let after = &rest[start + close + 2..];
        let target = link_target(after);
        shown.push_str(&rest[..start]);
        shown.push_str(&rest[start + 1..start + close]);
        rest = after.get(target.len() + 1..).unwrap_or("");
    }
    shown.push_str(rest);
    shown
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}
