//! The shell completions and manual pages that `leasehold` prints for
//! packagers, judged by the tools that consume them: bash loads and runs
//! the completion function, groff and man render the pages. What they must
//! offer is read from `leasehold --help`, not from the generators.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
/// Each tool here answers within milliseconds; this only keeps a broken
/// one from hanging the test.
const PATIENCE: Duration = Duration::from_secs(30);

/// Runs `cmd` with `input` on stdin, failing if it takes longer than
/// [`PATIENCE`].
fn run(cmd: &mut Command, input: &[u8]) -> Result<Output, Box<dyn std::error::Error>> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input)?;
    }
    let id = child.id();
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match result.recv_timeout(PATIENCE) {
        Ok(output) => Ok(output?),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &id.to_string()])
                .status();
            Err(format!("{cmd:?} did not finish in time").into())
        }
    }
}

fn leasehold(args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    let out = run(Command::new(BIN).args(args), b"")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "leasehold {args:?}: {stderr}");
    Ok(String::from_utf8(out.stdout)?)
}

/// The subcommands listed under "Commands:" in `leasehold --help`, without
/// clap's own `help`.
fn subcommands() -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let help = leasehold(&["--help"])?;
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect();
    // A parse that found nothing would make every check below vacuous.
    for expected in ["run", "status", "release", "watch", "completions", "man"] {
        assert!(names.iter().any(|n| n == expected), "{names:?}\n{help}");
    }
    Ok(names)
}

/// Every `--flag` that `leasehold run --help` defines (a line that starts
/// with the flag; descriptions that mention another flag are not one).
fn run_flags() -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let help = leasehold(&["run", "--help"])?;
    let mut flags: Vec<String> = help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            l.split([' ', ',', '='])
                .find(|w| w.starts_with("--") && w.len() > 2)
                .map(str::to_owned)
        })
        .collect();
    flags.sort();
    flags.dedup();
    for expected in [
        "--key",
        "--ttl",
        "--wait",
        "--grace",
        "--lost-grace",
        "--url",
    ] {
        assert!(flags.iter().any(|f| f == expected), "{flags:?}\n{help}");
    }
    Ok(flags)
}

/// What bash offers after `words` (the last one being completed) with the
/// completion script loaded, as a user pressing TAB would see.
fn bash_completes(script: &str, words: &[&str]) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let line = words.join(" ");
    let array = words
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let driver = format!(
        "{script}\n\
         COMP_WORDS=({array}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n\
         complete -p leasehold >/dev/null || exit 3\n\
         $(complete -p leasehold | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p') leasehold '{}' '{}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words.len() - 1,
        words[words.len() - 1],
        words[words.len().saturating_sub(2)],
    );
    let out = run(
        Command::new("bash").arg("--norc").arg("-s"),
        driver.as_bytes(),
    )?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "bash could not complete {words:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?
        .lines()
        .map(str::to_owned)
        .collect())
}

#[test]
fn the_bash_completions_parse_and_offer_every_subcommand_and_run_flag() -> TestResult {
    let script = leasehold(&["completions", "bash"])?;
    let syntax = run(Command::new("bash").arg("-n"), script.as_bytes())?;
    assert!(
        syntax.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );

    let offered = bash_completes(&script, &["leasehold", ""])?;
    for name in subcommands()? {
        assert!(offered.contains(&name), "{name} not offered: {offered:?}");
    }
    let offered = bash_completes(&script, &["leasehold", "run", "--"])?;
    for flag in run_flags()? {
        assert!(offered.contains(&flag), "{flag} not offered: {offered:?}");
    }
    Ok(())
}

#[test]
fn every_shell_gets_a_script_that_names_the_command() -> TestResult {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = leasehold(&["completions", shell])?;
        // fish spells flags `-l lost-grace`, the others `--lost-grace`.
        assert!(
            script.contains("leasehold") && script.contains("lost-grace"),
            "{shell}: {script}"
        );
    }
    let out = run(Command::new(BIN).args(["completions", "tcsh"]), b"")?;
    assert_eq!(out.status.code(), Some(64));
    Ok(())
}

/// Renders a page with groff, which warns (-ww) on stderr about malformed
/// roff, then with man as a reader would see it.
fn render(page: &[u8]) -> Result<String, Box<dyn std::error::Error>> {
    let checked = run(Command::new("groff").args(["-man", "-ww", "-z"]), page)?;
    assert!(checked.status.success());
    assert_eq!(String::from_utf8_lossy(&checked.stderr), "", "groff warned");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("page.1");
    std::fs::write(&path, page)?;
    let shown = run(
        Command::new("man")
            .arg("-l")
            .arg(&path)
            .env("MANWIDTH", "100")
            .env("MAN_KEEP_FORMATTING", "0")
            .env("PAGER", "cat"),
        b"",
    )?;
    assert!(
        shown.status.success(),
        "man -l: {}",
        String::from_utf8_lossy(&shown.stderr)
    );
    // man leaves overstrike sequences for bold text when not on a terminal.
    let text = String::from_utf8(shown.stdout)?;
    let mut plain = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    Ok(plain)
}

#[test]
fn the_manual_page_renders_and_lists_every_subcommand() -> TestResult {
    let shown = render(leasehold(&["man"])?.as_bytes())?;
    assert!(shown.contains("NAME"), "{shown}");
    let listed: String = shown
        .split("SUBCOMMANDS")
        .nth(1)
        .ok_or_else(|| format!("no SUBCOMMANDS section: {shown}"))?
        .to_owned();
    for name in subcommands()? {
        assert!(
            listed.contains(&format!("leasehold-{name}(1)")),
            "{name} not listed: {shown}"
        );
    }
    Ok(())
}

#[test]
fn a_page_per_subcommand_is_written_to_a_directory() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().to_str().ok_or("temporary path is not UTF-8")?;
    leasehold(&["man", "--dir", path])?;
    let top = std::fs::read(dir.path().join("leasehold.1"))?;
    render(&top)?;
    for name in subcommands()? {
        let page = std::fs::read(dir.path().join(format!("leasehold-{name}.1")))?;
        render(&page)?;
    }
    let run_page = render(&std::fs::read(dir.path().join("leasehold-run.1"))?)?;
    for flag in run_flags()? {
        assert!(run_page.contains(&flag), "{flag} missing: {run_page}");
    }
    Ok(())
}
