//! `class-info`: a CLOS class's metaclass, superclasses, subclasses, precedence list and slots,
//! per `contracts/class-info.md`.
//!
//! See docs/design.md, "The toolbox".

use serde::Deserialize;
use serde_json::{json, Value};

use super::lisp_reply::decode;
use super::arguments::arguments;
use super::{Arguments, Tool, ToolContext, ToolDefinition, ToolOutput, ToolResult};
use crate::image::{Entry, Request};

pub(crate) const TOOL: Tool = Tool::in_image(
    ToolDefinition {
        name: "class-info",
        arguments: Args::PARAMS,
        read_only: true,
        description: "A class's slots, superclasses, subclasses and metaclass.",
    },
    |context, args| Box::pin(call(context, args)),
);

arguments! {
    struct Args {
        class: String,
        package: Option<String>,
    }
}

async fn call(context: &ToolContext, args: &Arguments) -> ToolResult {
    let Args { class, package } = args.typed()?;
    let request = Request::new(Entry::CLASS_INFO).arg(class).key("package", package);
    let class = decode::<ClassInfo>("class-info", &context.call_helper(args, request).await?)?;
    Ok(ToolOutput::success(class.render()).with_structured(class.structured()))
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Slot {
    pub name: String,
    /// `type` is a Rust keyword.
    #[serde(rename = "type")]
    pub type_name: Option<String>,
    pub allocation: Option<String>,
    pub initargs: Vec<String>,
    pub initform: Option<String>,
    /// Readers R that have the writer (SETF R) too.
    pub accessors: Vec<String>,
    pub readers: Vec<String>,
    pub writers: Vec<String>,
    /// The superclass an inherited slot comes from; `None` for a direct slot.
    pub from: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClassInfo {
    pub name: String,
    pub package: Option<String>,
    pub metaclass: String,
    pub built_in: bool,
    pub superclasses: Vec<String>,
    pub subclasses: Vec<String>,
    /// `None` when the class is not finalized and cannot be yet.
    pub precedence: Option<Vec<String>>,
    pub not_finalized: Option<String>,
    pub documentation: Option<String>,
    pub direct_slots: Vec<Slot>,
    /// Slots from superclasses, nearest superclass first; empty when the class is not finalized.
    pub inherited_slots: Vec<Slot>,
    pub slot_count: Option<u64>,
    /// The classes whose own slots are inherited (not the direct superclasses they came through).
    pub slot_sources: Vec<String>,
}

impl ClassInfo {
    /// The contract's sections, in its order.
    pub fn render(&self) -> String {
        let mut header = format!("Class: {}\n  Metaclass: {}", self.name, self.metaclass);
        if let Some(package) = &self.package {
            header.push_str(&format!("\n  Package: {package}"));
        }
        if let Some(documentation) = &self.documentation {
            let mut lines = documentation.lines();
            header.push_str(&format!("\n  Documentation: {}", lines.next().unwrap_or_default()));
            for line in lines {
                header.push_str(format!("\n    {line}").trim_end());
            }
        }
        let mut sections = vec![
            header,
            name_list("Direct Superclasses", &self.superclasses),
            name_list("Direct Subclasses", &self.subclasses),
        ];
        sections.push(match (&self.precedence, &self.not_finalized) {
            (Some(precedence), _) => format!("Class Precedence List:\n  {}", precedence.join(" → ")),
            (None, why) => format!(
                "Class Precedence List: unknown\n  ({})",
                why.as_deref().unwrap_or("the class is not finalized")
            ),
        });
        if self.direct_slots.is_empty() {
            let mut section = "Direct Slots: (none)".to_string();
            if self.built_in {
                section.push_str("\n  (Built-in classes typically have no inspectable slots)");
            }
            sections.push(section);
        } else {
            let slots: Vec<String> = self.direct_slots.iter().map(render_slot).collect();
            sections.push(format!("Direct Slots ({}):\n{}", self.direct_slots.len(), slots.join("\n\n")));
        }
        // Shown when inheritance adds slots; a class with only its own slots needs no second count.
        if let Some(count) = self.slot_count.filter(|&n| n != self.direct_slots.len() as u64) {
            let mut section = format!("All Slots (inherited included): {count}");
            if !self.slot_sources.is_empty() {
                section.push_str(&format!("\n  (includes slots from {})", join_names(&self.slot_sources)));
            }
            sections.push(section);
        }
        // Beyond the contract (issue 13): which class each inherited slot comes from, and its options.
        if !self.inherited_slots.is_empty() {
            let slots: Vec<String> = self.inherited_slots.iter().map(render_slot).collect();
            sections.push(format!("Inherited Slots ({}):\n{}", self.inherited_slots.len(), slots.join("\n")));
        }
        sections.join("\n\n")
    }

    pub fn structured(&self) -> Value {
        json!({
            "name": self.name,
            "package": self.package,
            "metaclass": self.metaclass,
            "superclasses": self.superclasses,
            "subclasses": self.subclasses,
            "precedence_list": self.precedence,
            "not_finalized": self.not_finalized,
            "documentation": self.documentation,
            "direct_slots": self.direct_slots.iter().map(Slot::to_json).collect::<Vec<_>>(),
            "inherited_slots": self.inherited_slots.iter().map(Slot::to_json).collect::<Vec<_>>(),
            "slot_count": self.slot_count,
        })
    }
}

impl Slot {
    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_name,
            "allocation": self.allocation,
            "initargs": self.initargs,
            "initform": self.initform,
            "accessors": self.accessors,
            "readers": self.readers,
            "writers": self.writers,
            "from": self.from,
        })
    }
}

fn name_list(title: &str, names: &[String]) -> String {
    if names.is_empty() {
        format!("{title}: (none)")
    } else {
        let items: Vec<String> = names.iter().map(|n| format!("  - {n}")).collect();
        format!("{title}:\n{}", items.join("\n"))
    }
}

/// `A`, `A and B`, `A, B and C`.
fn join_names(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [only] => only.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

fn render_slot(slot: &Slot) -> String {
    let mut lines = vec![match &slot.from {
        Some(class) => format!("  {} (from {class})", slot.name),
        None => format!("  {}", slot.name),
    }];
    let mut add = |label: &str, value: &str| lines.push(format!("    {label}: {value}"));
    if let Some(type_name) = &slot.type_name {
        add("Type", type_name);
    }
    if let Some(allocation) = &slot.allocation {
        add("Allocation", allocation);
    }
    for initarg in &slot.initargs {
        add("Initarg", initarg);
    }
    if let Some(initform) = &slot.initform {
        add("Initform", initform);
    }
    for accessor in &slot.accessors {
        add("Accessor", accessor);
    }
    for reader in &slot.readers {
        add("Reader", reader);
    }
    for writer in &slot.writers {
        add("Writer", writer);
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swank::read;

    const PERSON: &str = "(:name \"PERSON\" :package \"MY-APP\" :metaclass \"STANDARD-CLASS\" :built-in nil \
         :superclasses (\"STANDARD-OBJECT\") :subclasses nil :precedence (\"PERSON\" \"STANDARD-OBJECT\" \"T\") :not-finalized nil \
         :direct-slots ((:name \"NAME\" :type nil :allocation nil :initargs (\":NAME\") :initform nil \
                         :accessors (\"PERSON-NAME\") :readers nil :writers nil :from nil) \
                        (:name \"AGE\" :type nil :allocation nil :initargs (\":AGE\") :initform \"0\" \
                         :accessors (\"PERSON-AGE\") :readers nil :writers nil :from nil)) \
         :documentation nil :inherited-slots nil :slot-count 2 :slot-sources nil)";

    #[test]
    fn the_contract_sections_render_in_order() {
        assert_eq!(
            decode::<ClassInfo>("class-info", &read(PERSON).unwrap()).unwrap().render(),
            "Class: PERSON\n  Metaclass: STANDARD-CLASS\n  Package: MY-APP\n\nDirect Superclasses:\n  - STANDARD-OBJECT\n\n\
             Direct Subclasses: (none)\n\nClass Precedence List:\n  PERSON → STANDARD-OBJECT → T\n\nDirect Slots (2):\n  NAME\n    \
             Initarg: :NAME\n    Accessor: PERSON-NAME\n\n  AGE\n    Initarg: :AGE\n    Initform: 0\n    Accessor: PERSON-AGE"
        );
    }

    #[test]
    fn a_reply_without_a_key_is_an_error_naming_it() {
        let error =
            decode::<ClassInfo>("class-info", &read(&PERSON.replace(":initform \"0\" ", "")).unwrap()).unwrap_err();
        assert!(
            error.0.contains(
                "reply to class-info is not what this server expects (:direct-slots 1: the reply has no :initform)"
            ),
            "{}",
            error.0
        );
        let error =
            decode::<ClassInfo>("class-info", &read(&PERSON.replace(" :slot-sources nil", "")).unwrap()).unwrap_err();
        assert!(error.0.contains("(the reply has no :slot-sources)"), "{}", error.0);
    }

    #[test]
    fn inherited_slots_name_where_they_come_from() {
        assert_eq!(join_names(&["CAR".into(), "AIRCRAFT".into()]), "CAR and AIRCRAFT");
        assert_eq!(join_names(&["A".into(), "B".into(), "C".into()]), "A, B and C");
    }
}
