//! The record of every tool call that the user's Emacs shows (`M-x swank-mcp-activity`,
//! elisp-compat/swank-mcp-activity.el): an observer of calls ([`crate::pipeline::observe`]) that tells the
//! image each call's state as it changes (waiting for approval, running, and how it ended, with
//! the reply text the agent received), and the image keeps the bounded record
//! (`lisp/activity.lisp`). Only the server sees every call: those the human declined, those that
//! failed before reaching the image, and the text as the agent gets it, after formatting.
//!
//! A call never waits for its record: it only hands its notes to a task of the feed's own, which
//! builds the requests and sends them in order. A call refused before it reached the image is
//! recorded too, which connects to an image given by `--port` or `--connect`; an image `--launch`
//! would start is not started for a record.
//!
//! See docs/design.md, "Emacs".

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::image::{CallLimits, Entry, Image, Request};
use crate::pipeline::observe::{CallStart, Ending, Observation, Observer};
use crate::swank::Form;

/// The reply text kept for Emacs; the rest is counted.
const MAX_RECORDED_CHARS: usize = 20_000;

/// The input shown for a call; the rest is counted.
const MAX_INPUT_CHARS: usize = 4_000;

/// How long the first note of a batch waits for others: a call that ends sooner is recorded by
/// one request, and the record is this much behind the calls.
const GATHER: Duration = Duration::from_millis(5);

/// How long the image may take to take one note.
const NOTE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a call is, as the record shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallState {
    Waiting,
    Running,
    Declined,
    TimedOut,
    Cancelled,
    Failed,
    Done,
}

impl CallState {
    fn keyword(self) -> &'static str {
        match self {
            CallState::Waiting => "waiting",
            CallState::Running => "running",
            CallState::Declined => "declined",
            CallState::TimedOut => "timed-out",
            CallState::Cancelled => "cancelled",
            CallState::Failed => "failed",
            CallState::Done => "done",
        }
    }

    fn of(ending: Ending) -> Self {
        match ending {
            Ending::Done => CallState::Done,
            Ending::Declined => CallState::Declined,
            Ending::TimedOut => CallState::TimedOut,
            // Withdrawn in favour of the call that brings the answer, which is recorded on its own.
            Ending::Cancelled | Ending::Deferred => CallState::Cancelled,
            Ending::Failed | Ending::Refused | Ending::UnknownTool => CallState::Failed,
        }
    }
}

/// One call as the record shows it, from its start to its end.
struct RecordedCall {
    image: Arc<Image>,
    id: String,
    tool: String,
    input: String,
    package: Option<String>,
    client: String,
    /// The files its arguments name (`file_path`, its own or an edit's): Emacs reverts the
    /// buffers that visit those the call wrote, which it tells by their dates, once it ended.
    files: Vec<String>,
}

/// A change of one call's state, and when it ended, the text and how long it ran (`None` when it
/// never ran); how long it waited for approval, once it stopped waiting.
struct Note {
    call: Arc<RecordedCall>,
    state: CallState,
    ended: Option<(String, Option<Duration>)>,
    waited: Option<Duration>,
}

impl Note {
    /// The note as `note-activities` takes it: a plist, `(:id id :tool tool :state state ...)`.
    fn form(&self) -> Form {
        let call = &self.call;
        let mut form = Vec::new();
        let mut key = |key, value: Form| form.extend([Form::Keyword(key), value]);
        key("id", call.id.as_str().into());
        key("tool", call.tool.as_str().into());
        key("state", Form::Keyword(self.state.keyword()));
        key("input", call.input.as_str().into());
        key("client", call.client.as_str().into());
        if let Some(package) = &call.package {
            key("package", package.as_str().into());
        }
        if !call.files.is_empty() {
            key("files", Form::List(call.files.iter().map(|file| file.as_str().into()).collect()));
        }
        let milliseconds = |duration: &Duration| Form::from(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
        if let Some((text, ran)) = &self.ended {
            key("text", text.as_str().into());
            if let Some(ran) = ran {
                key("milliseconds", milliseconds(ran));
            }
        }
        if let Some(waited) = &self.waited {
            key("waited", milliseconds(waited));
        }
        Form::List(form)
    }
}

/// The feed of one MCP session's calls, or of one `swank-mcp eval`, into the images' records.
pub struct ActivityFeed {
    notes: mpsc::UnboundedSender<Note>,
    sender: tokio::task::JoinHandle<()>,
    /// A call that ended without a connection to its image is not recorded there: for a
    /// one-shot command, which would otherwise connect again only for that, doubling the wait on
    /// a server that does not answer.
    one_shot: bool,
}

impl ActivityFeed {
    /// The feed of a session of calls (an MCP session); start within the server's runtime.
    pub fn start() -> Self {
        Self::new(false)
    }

    /// The feed of a one-shot command (`swank-mcp eval`).
    pub fn one_shot() -> Self {
        Self::new(true)
    }

    /// A feed whose notes a task of its own sends. The notes that come within [`GATHER`] of the
    /// first, or while a batch is on its way, go together in one request per image: a quick
    /// call's start and end cost the image one request, and a busy agent's calls one request at
    /// a time.
    fn new(one_shot: bool) -> Self {
        let (notes, mut queue) = mpsc::unbounded_channel::<Note>();
        let sender = tokio::spawn(async move {
            while let Some(first) = queue.recv().await {
                tokio::time::sleep(GATHER).await;
                let mut notes = vec![first];
                while let Ok(note) = queue.try_recv() {
                    notes.push(note);
                }
                let mut batches: Vec<(Arc<Image>, Vec<Form>)> = Vec::new();
                for note in latest_of_each_call(notes) {
                    match batches.iter_mut().find(|(image, _)| Arc::ptr_eq(image, &note.call.image)) {
                        Some((_, forms)) => forms.push(note.form()),
                        None => batches.push((note.call.image.clone(), vec![note.form()])),
                    }
                }
                for (image, forms) in batches {
                    // An image this server would start is not started for a record.
                    if image.current_connection().is_none() && image.launches() {
                        continue;
                    }
                    let limits =
                        CallLimits { timeout: NOTE_TIMEOUT, timeout_advice: "", cancel: CancellationToken::new() };
                    let notes =
                        Request::new(Entry::NOTE_ACTIVITIES).arg(Form::call("cl", "quote", [Form::List(forms)]));
                    if let Err(error) = image.call_helper(notes, &limits).await {
                        tracing::debug!(%error, "the activity record could not be updated");
                    }
                }
            }
        });
        Self { notes, sender, one_shot }
    }
}

impl Observer for ActivityFeed {
    fn begin(&self, start: &CallStart<'_>) -> Box<dyn Observation> {
        let Some(image) = start.image.cloned() else { return Box::new(Unrecorded) };
        let object = start.arguments.as_ref().and_then(Value::as_object);
        let argument = |name: &str| object.and_then(|o| o.get(name)).and_then(Value::as_str);
        let input = match (argument("code"), object) {
            (Some(code), _) => bounded(code, MAX_INPUT_CHARS),
            (None, Some(object)) if !object.is_empty() => {
                bounded(&serde_json::to_string(object).unwrap_or_default(), MAX_INPUT_CHARS)
            }
            _ => String::new(),
        };
        let call = Arc::new(RecordedCall {
            id: start.id.to_string(),
            image,
            tool: start.tool.to_string(),
            input,
            package: argument("package").map(str::to_string),
            client: start.client.to_string(),
            files: object.map(named_files).unwrap_or_default(),
        });
        let now = Instant::now();
        let recorded = Recorded {
            notes: self.notes.clone(),
            call,
            started: now,
            running_since: (!start.waiting).then_some(now),
            waited: None,
            one_shot: self.one_shot,
        };
        recorded.note(if start.waiting { CallState::Waiting } else { CallState::Running }, None);
        Box::new(recorded)
    }

    /// Returns once every note given so far has been sent (or has failed): a one-shot command
    /// that exits right after its call would otherwise take the call's end with it.
    fn finish(self: Box<Self>) -> BoxFuture<'static, ()> {
        let ActivityFeed { notes, sender, .. } = *self;
        drop(notes);
        Box::pin(async move {
            let _ = sender.await;
        })
    }
}

/// The `file_path` arguments of a call: its own, and those of the objects its list arguments hold
/// (`edit-lisp-form`'s `edits`), each once.
fn named_files(arguments: &serde_json::Map<String, Value>) -> Vec<String> {
    let own = std::iter::once(arguments);
    let nested = arguments.values().filter_map(Value::as_array).flatten().filter_map(Value::as_object);
    let mut files: Vec<String> = Vec::new();
    for file in own.chain(nested).filter_map(|object| object.get("file_path").and_then(Value::as_str)) {
        if !files.iter().any(|seen| seen == file) {
            files.push(file.to_string());
        }
    }
    files
}

/// The last of `notes` (in the order given) of each call: a note carries all the record needs
/// of its call (its input, its state, and once it ended its text), so a call that started and
/// ended within one batch costs the image one note.
fn latest_of_each_call(notes: Vec<Note>) -> Vec<Note> {
    let mut latest: Vec<Note> = Vec::with_capacity(notes.len());
    for note in notes {
        match latest.iter_mut().find(|kept| Arc::ptr_eq(&kept.call, &note.call)) {
            Some(kept) => *kept = note,
            None => latest.push(note),
        }
    }
    latest
}

/// A call in an image that is not configured: nowhere to record it.
struct Unrecorded;

impl Observation for Unrecorded {
    fn end(self: Box<Self>, _: Ending, _: &str) {}
}

/// A call the feed records. Its time waiting for approval is the person's, not the call's: the
/// record shows it apart from how long the call ran.
struct Recorded {
    notes: mpsc::UnboundedSender<Note>,
    call: Arc<RecordedCall>,
    started: Instant,
    /// When it began to run; `None` while it waits for approval, or when it never ran.
    running_since: Option<Instant>,
    /// How long it waited for approval, once it stopped waiting.
    waited: Option<Duration>,
    one_shot: bool,
}

impl Recorded {
    fn note(&self, state: CallState, text: Option<&str>) {
        let ran = self.running_since.map(|since| since.elapsed());
        let ended = text.map(|text| (bounded(text, MAX_RECORDED_CHARS), ran));
        // The receiver lives as long as the runtime; a send after it ended has nowhere to go.
        let _ = self.notes.send(Note { call: self.call.clone(), state, ended, waited: self.waited });
    }

    /// Notes that the call stopped waiting for approval now, if it was waiting.
    fn stop_waiting(&mut self) {
        if self.running_since.is_none() && self.waited.is_none() {
            self.waited = Some(self.started.elapsed());
        }
    }
}

impl Observation for Recorded {
    fn running(&mut self) {
        self.stop_waiting();
        self.running_since = Some(Instant::now());
        self.note(CallState::Running, None);
    }

    fn end(mut self: Box<Self>, ending: Ending, text: &str) {
        self.stop_waiting();
        if self.one_shot && self.call.image.current_connection().is_none() {
            return;
        }
        let text = match ending {
            Ending::Cancelled => "(The client cancelled the call: it was sent no reply.)",
            _ => text,
        };
        self.note(CallState::of(ending), Some(text));
    }
}

/// `text` cut to `limit` characters, saying how many more there were.
fn bounded(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((cut, _)) => {
            let more = text[cut..].chars().count();
            format!("{}\n[... {more} more characters not recorded]", &text[..cut])
        }
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::mpsc;

    use super::{bounded, latest_of_each_call, CallState, Recorded, RecordedCall};
    use crate::image::helper::{BOOTSTRAP_SOURCE, HELPER_SOURCE};
    use crate::image::{Image, ImageSettings};
    use crate::swank::{ConnectOptions, Endpoint, Protocol};

    /// Every [`CallState`]: the states this server notes calls in.
    const NOTED_STATES: [CallState; 7] = [
        CallState::Waiting,
        CallState::Running,
        CallState::Declined,
        CallState::TimedOut,
        CallState::Cancelled,
        CallState::Failed,
        CallState::Done,
    ];

    /// The text of every file of the Emacs package, `elisp-compat/*.el`.
    fn emacs_sources() -> String {
        let directory = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("elisp-compat");
        let mut text = String::new();
        for entry in std::fs::read_dir(directory).expect("elisp-compat lists") {
            let path = entry.expect("an entry").path();
            if path.extension().is_some_and(|e| e == "el") {
                text.push_str(&std::fs::read_to_string(&path).expect("an Emacs Lisp file reads"));
            }
        }
        assert!(text.contains("(provide 'swank-mcp)"), "elisp-compat/*.el were not read");
        text
    }

    /// The keys of the Emacs package's alist `(defconst NAME '((:KEY ...) ...) ...)`, as `:key`.
    fn emacs_alist_keys(emacs: &str, name: &str) -> BTreeSet<String> {
        let start = emacs.find(&format!("(defconst {name}\n")).unwrap_or_else(|| panic!("Emacs defines no {name}"));
        let list = &emacs[start..][emacs[start..].find("'(").expect("a quoted list") + 1..];
        let mut keys = BTreeSet::new();
        let (mut depth, mut chars) = (0, list.char_indices().peekable());
        while let Some((at, c)) = chars.next() {
            match c {
                ';' => while chars.next_if(|(_, c)| *c != '\n').is_some() {},
                '"' => {
                    while let Some((_, c)) = chars.next() {
                        match c {
                            '\\' => {
                                chars.next();
                            }
                            '"' => break,
                            _ => {}
                        }
                    }
                }
                '(' => {
                    depth += 1;
                    if depth == 2 && list[at + 1..].starts_with(':') {
                        keys.insert(list[at + 1..].split_whitespace().next().unwrap_or_default().to_string());
                    }
                }
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return keys;
                    }
                }
                _ => {}
            }
        }
        panic!("{name}'s list does not end");
    }

    /// The keywords of each place in the helper's code where `opener` is followed by one.
    fn helper_keywords_after(opener: &str) -> BTreeSet<String> {
        HELPER_SOURCE
            .match_indices(opener)
            .filter_map(|(at, _)| {
                let rest = HELPER_SOURCE[at + opener.len()..].trim_start();
                rest.starts_with(':').then(|| rest.split([' ', ')', '\n']).next().unwrap_or_default().to_lowercase())
            })
            .collect()
    }

    /// The helper's `*call-states*` is the one statement of the states the servers note; this
    /// server notes exactly those, and Emacs shows those and the ones the image sets itself.
    #[test]
    fn the_call_states_are_the_helpers_in_rust_and_emacs() {
        let opener = "(defparameter *call-states* '(";
        let at = HELPER_SOURCE.find(opener).expect("the helper defines *call-states*") + opener.len();
        let helper: BTreeSet<String> = HELPER_SOURCE[at..][..HELPER_SOURCE[at..].find(')').expect("the list ends")]
            .split_whitespace()
            .map(str::to_lowercase)
            .collect();
        let rust: BTreeSet<String> = NOTED_STATES.iter().map(|state| format!(":{}", state.keyword())).collect();
        assert_eq!(rust, helper, "CallState against the helper's *call-states*");

        // The states Emacs shows besides: those the image gives a record itself (a call it ends,
        // an event between the calls), and Emacs's own (`:state :unknown` when its connection
        // closed first).
        let emacs = emacs_sources();
        let shown = emacs_alist_keys(&emacs, "swank-mcp--call-states");
        assert!(shown.is_superset(&helper), "swank-mcp--call-states lacks some of {helper:?}: {shown:?}");
        let own: Vec<&String> = shown.difference(&helper).collect();
        assert!(!own.is_empty(), "Emacs shows no state of the image's own (:lost, :event)");
        for state in own {
            assert!(
                HELPER_SOURCE.contains(&format!("(setf (record-state record) {state}"))
                    || HELPER_SOURCE.contains(&format!(":state {state})"))
                    || emacs.contains(&format!(":state {state})")),
                "Emacs shows the state {state}, which neither the helper nor Emacs gives a record"
            );
        }
    }

    /// The kinds of event the image records are the ones Emacs names: those of the helper's own
    /// `note-event` calls, those Emacs may ask it to record (`*emacs-event-kinds*`) and the
    /// bootstrap.s (`:state :event :event :helper`).
    #[test]
    fn the_event_kinds_are_the_helpers_in_emacs() {
        let opener = "(defparameter *emacs-event-kinds* '(";
        let at = HELPER_SOURCE.find(opener).expect("the helper defines *emacs-event-kinds*") + opener.len();
        let from_emacs =
            HELPER_SOURCE[at..][..HELPER_SOURCE[at..].find(')').expect("the list ends")].split_whitespace();
        let bootstrap = BOOTSTRAP_SOURCE
            .split(":state :event :event :")
            .skip(1)
            .filter_map(|rest| rest.split(|c: char| c.is_whitespace() || c == ')').next());
        let mut recorded = helper_keywords_after("(note-event");
        recorded.extend(from_emacs.map(str::to_lowercase));
        recorded.extend(bootstrap.map(|kind| format!(":{kind}")));
        assert!(recorded.contains(":attached") && recorded.contains(":helper"), "{recorded:?}");
        assert_eq!(emacs_alist_keys(&emacs_sources(), "swank-mcp--event-kinds"), recorded);
    }

    fn recorded(image: &Arc<Image>, id: &str, notes: &mpsc::UnboundedSender<super::Note>) -> Recorded {
        let call = RecordedCall {
            image: image.clone(),
            id: id.to_string(),
            tool: "evaluate-lisp".to_string(),
            input: "(+ 1 2)".to_string(),
            package: None,
            client: "test".to_string(),
            files: Vec::new(),
        };
        let now = std::time::Instant::now();
        Recorded {
            notes: notes.clone(),
            call: Arc::new(call),
            started: now,
            running_since: Some(now),
            waited: None,
            one_shot: false,
        }
    }

    /// An image nothing listens for: these tests look at the notes, never send them.
    fn unreachable_image() -> Arc<Image> {
        Arc::new(Image::new(ImageSettings {
            name: "default".into(),
            endpoint: Endpoint { host: "127.0.0.1".into(), port: 1 },
            connect: ConnectOptions { connect_timeout: Duration::from_secs(1), secret: None, protocol: Protocol::Auto },
            launch: None,
        }))
    }

    #[test]
    fn a_batch_sends_the_last_note_of_each_call_in_the_order_the_calls_started() {
        let image = unreachable_image();
        let (sender, mut queue) = mpsc::unbounded_channel();
        let (first, second) = (recorded(&image, "c-1", &sender), recorded(&image, "c-2", &sender));
        first.note(CallState::Running, None);
        second.note(CallState::Waiting, None);
        first.note(CallState::Done, Some("3"));
        second.note(CallState::Running, None);
        let mut notes = Vec::new();
        while let Ok(note) = queue.try_recv() {
            notes.push(note);
        }
        let sent: Vec<String> = latest_of_each_call(notes).iter().map(|note| note.form().to_wire()).collect();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert!(
            sent[0].starts_with(
                r#"(:id "c-1" :tool "evaluate-lisp" :state :done :input "(+ 1 2)" :client "test" :text "3""#
            ),
            "{sent:?}"
        );
        assert_eq!(sent[1], r#"(:id "c-2" :tool "evaluate-lisp" :state :running :input "(+ 1 2)" :client "test")"#);
    }

    #[test]
    fn the_wait_for_approval_is_noted_apart_from_how_long_the_call_ran() {
        use crate::pipeline::observe::{Ending, Observation};
        let image = unreachable_image();
        let (sender, mut queue) = mpsc::unbounded_channel();
        let waiting = |id: &str| {
            let mut call = recorded(&image, id, &sender);
            call.running_since = None;
            call.started -= Duration::from_millis(1500);
            Box::new(call)
        };
        let mut approved = waiting("c-1");
        approved.running();
        approved.end(Ending::Done, "3");
        waiting("c-2").end(Ending::Declined, "declined by the user");
        let mut notes = Vec::new();
        while let Ok(note) = queue.try_recv() {
            notes.push(note.form().to_wire());
        }
        let waited = |note: &str| {
            let after = note.split(":waited ").nth(1).unwrap_or_else(|| panic!("no :waited in {note}"));
            after.trim_end_matches(')').parse::<u64>().unwrap()
        };
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains(":running") && waited(&notes[0]) >= 1500, "{notes:?}");
        assert!(notes[1].contains(":done") && waited(&notes[1]) >= 1500, "{notes:?}");
        let ran = notes[1].split(":milliseconds ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap();
        assert!(ran.parse::<u64>().unwrap() < 1000, "the run's time leaves the wait out: {notes:?}");
        assert!(notes[2].contains(":declined") && !notes[2].contains(":milliseconds"), "it never ran: {notes:?}");
        assert!(waited(&notes[2]) >= 1500, "{notes:?}");
    }

    #[test]
    fn the_files_a_call_names_are_its_own_and_its_edits_each_once() {
        let arguments = serde_json::json!({
            "file_path": "/src/a.lisp",
            "edits": [{"file_path": "/src/b.lisp"}, {"file_path": "/src/a.lisp"}, {"form_name": "f"}],
            "code": "(+ 1 2)"
        });
        assert_eq!(super::named_files(arguments.as_object().unwrap()), ["/src/a.lisp", "/src/b.lisp"]);
        assert!(super::named_files(serde_json::json!({"code": "1"}).as_object().unwrap()).is_empty());
    }

    #[test]
    fn a_long_text_is_cut_on_a_character_and_says_how_much_was_left_out() {
        assert_eq!(bounded("abc", 3), "abc");
        assert_eq!(bounded("αβγδ", 2), "αβ\n[... 2 more characters not recorded]");
    }
}
