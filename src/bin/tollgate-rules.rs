//! `tollgate-rules check FILE`: checks a rules document (TOML, or JSON for `.json` files)
//! as a server would load it, and prints its limits.
//!
//! Exit status 0 when the rules are valid; 1 with the error (`rules.toml:14:
//! limits[2].quota: ...`) on standard error when they are not (a file that is not a
//! regular one, is larger than 16 MiB or nests more than 128 levels deep included, as a
//! server would refuse it); 2 for a bad command line.
//!
//! `tollgate-rules simulate RULES --log FILE`: replays an access log through the rules
//! (`tollgate::rules::Simulation`) and prints, per limit, the requests, the refusals,
//! the most refused keys and when the refusals happened; `--html OUT` also writes the
//! report as a self-contained HTML page with charts. Exit status 0 when the log was
//! replayed (bad lines are reported, not fatal); 1 for invalid rules or an unreadable
//! log; 2 for a bad command line.
//!
//! `tollgate-rules suggest --log FILE --key ip|header:NAME`: suggests limits from an
//! access log (`tollgate::rules::suggest::Suggestion`): each key's peak requests per
//! 1 s, 1 min and 1 h, their distribution, and the `[[limits]]` that a share of the keys
//! (99.9 % by default) would never have met. Exit status 0 when the log was read; 1 for
//! an unreadable log; 2 for a bad command line.

use std::io::{IsTerminal, Read};
use std::path::Path;
use std::process::ExitCode;

use tollgate::rules::suggest::{SuggestKey, Suggestion};
use tollgate::rules::{
    CombinedFields, Document, Format, JsonFields, LogFormat, Report, Simulation,
};

const USAGE: &str = "usage: tollgate-rules check FILE
       tollgate-rules simulate RULES --log FILE [--json] [--format combined|json]
                      [--field ROLE=FIELD]... [--header NAME=FIELD]... [--against OLD_RULES]
                      [--max-line BYTES] [--max-held N] [--top N] [--html OUT.html]
       tollgate-rules suggest --log FILE --key ip|header:NAME [--route] [--share PERCENT]
                      [--json] [--html OUT.html] [--format combined|json] [--field ROLE=FIELD]...
                      [--header NAME=FIELD]... [--max-keys N] [--max-routes N] [--max-line BYTES]";

const SIMULATE_HELP: &str =
    "simulate: replays an access log (FILE, or - for standard input) through RULES
with the real engine on a simulated clock, and prints per limit the requests, the refusals,
the most refused keys and the refusals over time.

  --format combined    nginx/Apache combined format (the default)
  --format json        one JSON object per line; fields named by --field and --header
  --field ROLE=FIELD   ROLE one of client, time, method, path, status (defaults: remote_addr,
                       time, method, path, status); time is RFC 3339 or Unix seconds
  --field usage=FIELD  the request's actual usage: limits with `settle` settle to it (as
                       the header or trailer they read); without it the estimate stands
  --field duration=FIELD
                       the request's duration in seconds ($request_time, e.g. 0.250): its
                       response is held that long, so in-flight limits count it; without
                       it every request ends at once and in-flight limits never refuse
                       (in the combined format, FIELD of usage and duration is a position
                       after the user agent: 1 is the first field appended to it; a name
                       that is not a number implies --format json)
  --header NAME=FIELD  the request gets header NAME from FIELD (for header keys)
  --against OLD_RULES  also replays through OLD_RULES and lists the keys refused by one only
  --json               the report as JSON
  --html OUT.html      also writes the report as one HTML page with charts (no script,
                       nothing loaded from the network)
  --max-line BYTES     longer lines are counted as bad and skipped (default 65536)
  --max-held N         the most responses held at once for their duration (default
                       1000000); past it the first to end is let go early (reported)
  --top N              the most refused keys shown per limit (default 10)

Bans are counted apart: refusals by a ban, and the bans that began by repeat level.
Not rehearsed: delay mode waits for real; calendar quotas follow the wall clock; the store
is one memory store (no Redis failure policies, leases or shared bans).";

const SUGGEST_HELP: &str =
    "suggest: reads an access log (FILE; read 5 times, so not -) and prints, per key,
the distribution of its peak requests in any 1 s, 1 min and 1 h, and the [[limits]] (GCRA quotas,
per window) that at least PERCENT of the keys would never have been refused by, as a rules file
(PERCENT of few keys rounds up to whole keys, unless the key that takes in is an outlier: a peak
more than 4 times every other key's; then it rounds down, and the outlier is refused).

  --key ip             per client address (peer_ip)
  --key header:NAME    per value of header NAME (with --format json and --header NAME=FIELD)
  --route              per key and route (METHOD /path, ids grouped as {id}), one set of limits
                       per route, for the busiest routes (--max-routes, default 20)
  --share PERCENT      the share of keys never refused (default 99.9)
  --format, --field, --header, --max-line   as for simulate
  --max-keys N         the most keys measured (default 1000000); requests beyond are counted
  --json               the figures and the rules as JSON
  --html OUT.html      also write a self-contained report: the distributions as charts";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [command, file] if command == "check" => check(Path::new(file)),
        [command, rest @ ..] if command == "simulate" => match SimulateArgs::parse(rest) {
            Ok(Some(args)) => simulate(&args),
            Ok(None) => {
                println!("{USAGE}\n\n{SIMULATE_HELP}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}\n{USAGE}");
                ExitCode::from(2)
            }
        },
        [command, rest @ ..] if command == "suggest" => match SuggestArgs::parse(rest) {
            Ok(Some(args)) => suggest(&args),
            Ok(None) => {
                println!("{USAGE}\n\n{SUGGEST_HELP}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}\n{USAGE}");
                ExitCode::from(2)
            }
        },
        [flag] if flag == "-h" || flag == "--help" => {
            println!(
                "{USAGE}\n\ncheck: checks a rules document (TOML, or JSON for .json files) and prints its limits.\n\n{SIMULATE_HELP}\n\n{SUGGEST_HELP}"
            );
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match load(path) {
        Ok(doc) => {
            print!("{doc}");
            for route in doc.unmet_routes().unwrap_or_default() {
                println!(
                    "warning: the route `{route}` can meet none of settings.app_routes: \
                     its limits apply only to requests no route serves"
                );
            }
            println!("{}: {} limits, valid", path.display(), doc.limits.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads and checks the document as `Rules` does, with the error located in the file.
fn load(path: &Path) -> Result<Document, tollgate::ConfigError> {
    let format = Format::from_path(path);
    // Builds the rules over a throwaway store, without watching: the same checks, the
    // same messages as a server loading the file.
    let rules = tollgate::rules::Rules::builder(tollgate::store::MemoryStore::new())
        .file(path)
        .format(format)
        .watch(false)
        .sighup(false)
        .build()?;
    Ok((*rules.document()).clone())
}

/// The command line of `simulate`.
struct SimulateArgs {
    rules: String,
    log: String,
    json: bool,
    against: Option<String>,
    html: Option<String>,
    simulation: Simulation,
}

impl SimulateArgs {
    /// `None` for `--help`.
    fn parse(args: &[String]) -> Result<Option<Self>, String> {
        let mut rules = None;
        let mut log = None;
        let mut json = false;
        let mut against = None;
        let mut html = None;
        let mut log_format = LogArgs::default();
        let mut max_line = None;
        let mut max_held = None;
        let mut top = None;
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |flag: &str| {
                args.next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match arg.as_str() {
                "-h" | "--help" => return Ok(None),
                "--json" => json = true,
                "--log" => log = Some(value("--log")?),
                "--against" => against = Some(value("--against")?),
                "--html" => html = Some(value("--html")?),
                flag @ ("--format" | "--field" | "--header") => {
                    log_format.set(flag, value(flag)?)?;
                }
                "--max-line" => max_line = Some(number("--max-line", &value("--max-line")?)?),
                "--max-held" => max_held = Some(number("--max-held", &value("--max-held")?)?),
                "--top" => top = Some(number("--top", &value("--top")?)?),
                flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
                file if rules.is_none() => rules = Some(file.to_owned()),
                extra => return Err(format!("unexpected argument {extra}")),
            }
        }
        let format = log_format.format()?;
        let mut simulation = Simulation::new(format);
        if let Some(n) = max_line {
            simulation = simulation.max_line(n);
        }
        if let Some(n) = max_held {
            simulation = simulation.max_held(n);
        }
        if let Some(n) = top {
            simulation = simulation.top(n);
        }
        Ok(Some(Self {
            rules: rules.ok_or("simulate needs a RULES file")?,
            log: log.ok_or("simulate needs --log FILE")?,
            json,
            against,
            html,
            simulation,
        }))
    }
}

/// `--format`, `--field` and `--header`, as `simulate` and `suggest` read them.
#[derive(Default)]
struct LogArgs {
    format: Option<String>,
    fields: JsonFields,
    /// Whether a field was mapped: `--field` (but `usage` and `duration`) or `--header`
    /// imply JSON lines.
    mapped: bool,
    /// `--field usage=...` and `--field duration=...`: a JSON field's name, or a
    /// position after the user agent in the combined format (read once the format is
    /// known).
    either: Vec<String>,
}

impl LogArgs {
    fn set(&mut self, flag: &str, value: String) -> Result<(), String> {
        match flag {
            "--format" => self.format = Some(value),
            "--field" if value.starts_with("usage=") || value.starts_with("duration=") => {
                self.either.push(value);
                return Ok(());
            }
            "--field" => self.fields.set(&value).map_err(|e| e.to_string())?,
            _ => self.fields.header(&value).map_err(|e| e.to_string())?,
        }
        self.mapped |= flag != "--format";
        Ok(())
    }

    fn format(mut self) -> Result<LogFormat, String> {
        let json = match self.format.as_deref() {
            Some("json") => true,
            // A field named, not a position: JSON lines.
            None => {
                self.mapped
                    || self.either.iter().any(|spec| {
                        let (_, field) = spec.split_once('=').unwrap_or_default();
                        !field.bytes().all(|c| c.is_ascii_digit())
                    })
            }
            Some("combined") if self.mapped => {
                return Err(
                    "--header and --field (but usage and duration) apply to --format json".into(),
                );
            }
            Some("combined") => false,
            Some(other) => return Err(format!("unknown --format {other}: combined or json")),
        };
        if json {
            for spec in &self.either {
                self.fields.set(spec).map_err(|e| e.to_string())?;
            }
            return Ok(LogFormat::Json(self.fields));
        }
        if self.either.is_empty() {
            return Ok(LogFormat::Combined);
        }
        let mut fields = CombinedFields::default();
        for spec in &self.either {
            fields.set(spec).map_err(|e| e.to_string())?;
        }
        Ok(LogFormat::CombinedWith(fields))
    }
}

fn number(flag: &str, value: &str) -> Result<usize, String> {
    value
        .parse()
        .map_err(|_| format!("{flag}: `{value}` is not a number"))
}

fn simulate(args: &SimulateArgs) -> ExitCode {
    let run = |rules: &str| -> Result<Report, String> {
        let doc = load(Path::new(rules)).map_err(|e| e.to_string())?;
        let report = if args.log == "-" {
            args.simulation.run(&doc, std::io::stdin().lock())
        } else {
            let file = std::fs::File::open(&args.log).map_err(|e| format!("{}: {e}", args.log))?;
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            let progress = Progress::new(file, size);
            let report = args
                .simulation
                .run(&doc, std::io::BufReader::with_capacity(1 << 16, progress));
            if progress_shown(size) {
                eprint!("\r{:80}\r", "");
            }
            report
        };
        report.map_err(|e| format!("{}: {e}", args.log))
    };
    if args.against.is_some() && args.log == "-" {
        eprintln!("--against reads the log twice: give a file, not -");
        return ExitCode::from(2);
    }
    let report = match run(&args.rules) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let old = match &args.against {
        None => None,
        Some(old) => match run(old) {
            Ok(old) => Some(old),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let difference = old.as_ref().map(|old| report.difference(old));
    if let Some(path) = &args.html {
        let mut title = format!("{} on {}", args.rules, args.log);
        if let Some(old) = &args.against {
            title.push_str(&format!(", against {old}"));
        }
        if let Err(e) = std::fs::write(path, report.to_html(difference.as_ref(), &title)) {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    }
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) ends the output, not in a panic.
    let _ = if args.json {
        let mut json = report.to_json();
        if let (Some(d), Some(obj)) = (&difference, json.as_object_mut()) {
            obj.insert("against".into(), d.to_json());
        }
        writeln!(out, "{json}")
    } else {
        write!(out, "{report}").and_then(|()| match &difference {
            Some(d) => write!(
                out,
                "\nagainst {}:\n{d}",
                args.against.as_deref().unwrap_or("")
            ),
            None => Ok(()),
        })
    };
    ExitCode::SUCCESS
}

/// Whether a log of `size` bytes shows its progress: on a terminal only.
fn progress_shown(size: u64) -> bool {
    size > 0 && std::io::stderr().is_terminal()
}

/// A log file's reader that shows how far it got on standard error when that is a
/// terminal: a bar, the percentage and the bytes read, redrawn at each whole percent of
/// the file (at most 100 times). On a pipe it only counts.
struct Progress<R> {
    inner: R,
    size: u64,
    read: u64,
    shown: u64,
    on: bool,
}

impl<R> Progress<R> {
    fn new(inner: R, size: u64) -> Self {
        Self {
            inner,
            size,
            read: 0,
            shown: 0,
            on: progress_shown(size),
        }
    }
}

impl<R: Read> Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.on {
            let percent = (self.read * 100 / self.size).min(100);
            if percent > self.shown {
                self.shown = percent;
                eprint!("\r{}", progress_line(self.read, self.size));
            }
        }
        Ok(n)
    }
}

/// The command line of `suggest`.
struct SuggestArgs {
    log: String,
    json: bool,
    html: Option<String>,
    suggestion: Suggestion,
}

impl SuggestArgs {
    /// `None` for `--help`.
    fn parse(args: &[String]) -> Result<Option<Self>, String> {
        let mut log = None;
        let mut key = None;
        let mut json = false;
        let mut html = None;
        let mut route = false;
        let mut share = 99.9;
        let mut log_format = LogArgs::default();
        let mut max_line = None;
        let mut max_keys = None;
        let mut max_routes = None;
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |flag: &str| {
                args.next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match arg.as_str() {
                "-h" | "--help" => return Ok(None),
                "--json" => json = true,
                "--route" => route = true,
                "--html" => html = Some(value("--html")?),
                "--log" => log = Some(value("--log")?),
                "--key" => {
                    key = Some(
                        value("--key")?
                            .parse::<SuggestKey>()
                            .map_err(|e| e.to_string())?,
                    );
                }
                "--share" => {
                    let v = value("--share")?;
                    share = v
                        .trim_end_matches('%')
                        .parse::<f64>()
                        .ok()
                        .filter(|p| *p > 0.0 && *p <= 100.0)
                        .ok_or_else(|| {
                            format!("--share: `{v}` is not a percentage above 0, at most 100")
                        })?;
                }
                flag @ ("--format" | "--field" | "--header") => {
                    log_format.set(flag, value(flag)?)?;
                }
                "--max-line" => max_line = Some(number("--max-line", &value("--max-line")?)?),
                "--max-keys" => max_keys = Some(number("--max-keys", &value("--max-keys")?)?),
                "--max-routes" => {
                    max_routes = Some(number("--max-routes", &value("--max-routes")?)?);
                }
                other => return Err(format!("unexpected argument {other}")),
            }
        }
        let format = log_format.format()?;
        let log = log.ok_or("suggest needs --log FILE")?;
        if log == "-" {
            return Err("suggest reads the log several times: give a file, not -".into());
        }
        let key = key.ok_or("suggest needs --key ip or --key header:NAME")?;
        let mut suggestion = Suggestion::new(format, key)
            .routes(route)
            .share(share / 100.0);
        if let Some(n) = max_line {
            suggestion = suggestion.max_line(n);
        }
        if let Some(n) = max_keys {
            suggestion = suggestion.max_keys(n);
        }
        if let Some(n) = max_routes {
            suggestion = suggestion.max_routes(n);
        }
        Ok(Some(Self {
            log,
            json,
            html,
            suggestion,
        }))
    }
}

fn suggest(args: &SuggestArgs) -> ExitCode {
    let open =
        || std::fs::File::open(&args.log).map(|f| std::io::BufReader::with_capacity(1 << 16, f));
    match args.suggestion.run(open) {
        Ok(suggested) => {
            use std::io::Write;
            if let Some(path) = &args.html
                && let Err(e) = std::fs::write(path, suggested.to_html(&args.log))
            {
                eprintln!("{path}: {e}");
                return ExitCode::FAILURE;
            }
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) ends the output, not in a panic.
            let _ = if args.json {
                writeln!(out, "{}", suggested.to_json())
            } else {
                write!(out, "{suggested}")
            };
            ExitCode::SUCCESS
        }
        Err(e @ tollgate::rules::SimulateError::Rules(_)) => {
            eprintln!("{e}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("{}: {e}", args.log);
            ExitCode::FAILURE
        }
    }
}

/// `replaying [##########----------]  50%  12.0 / 24.0 MiB`.
fn progress_line(read: u64, size: u64) -> String {
    const WIDTH: u64 = 30;
    let read = read.min(size);
    let percent = read * 100 / size.max(1);
    let done = (read * WIDTH / size.max(1)) as usize;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    format!(
        "replaying [{}{}] {percent:>3}%  {:.1} / {:.1} MiB",
        "#".repeat(done),
        "-".repeat(WIDTH as usize - done),
        mib(read),
        mib(size),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bar() {
        assert_eq!(
            progress_line(3 << 19, 3 << 20),
            "replaying [###############---------------]  50%  1.5 / 3.0 MiB"
        );
        assert!(progress_line(10, 5).contains("100%"));
        assert!(progress_line(0, 0).contains("  0%"));
    }
}
