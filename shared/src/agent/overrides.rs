//! Overrides: the steering a message (`user_message`) or a pause's answer (`tool_outputs`)
//! posts, kept on the run.
//!
//! A message may set the run's tool choice and active tools (as `defaults`), step rules and
//! stop conditions of its own, its `max_steps` (up to the agent's ceiling) and
//! `max_call_depth` (up to the agent's), and add to its instructions (with an admin token, or
//! when the agent allows it); the OpenAI-compatible routes replace the instructions (admin).
//! A pause's answer may set the next model call's tool choice and tools, rules for later steps
//! and a default tool choice for the rest of the run. The run keeps what every pause posted
//! ([`RunOverrides::accumulate`]: the next-step choices pinned to their steps, the newest rules
//! first); the worker applies it to the spec it executes ([`RunOverrides::apply`]), where the
//! step rules resolve as they always do ([`AgentSpec::rules_for`]).

use serde::{Deserialize, Serialize};

use super::{
    AgentSpec, ClientToolSpec, FieldError, ResponseFormat, StepRule, StopCondition, ToolChoice,
    ToolSpec,
};

/// Steering posted with a pause's answer (`tool_outputs`): the next model call's tool choice
/// and tools, rules for later steps (ahead of the agent's), and a tool choice for the rest of
/// the run. Stored on the run as JSON; absent fields change nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunOverrides {
    /// The tool choice of the next model call.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// The tools offered in the next model call.
    #[serde(default)]
    pub active_tools: Option<Vec<String>>,
    /// Rules for later steps.
    #[serde(default)]
    pub step_rules: Option<Vec<StepRule>>,
    /// Defaults for the rest of the run.
    #[serde(default)]
    pub defaults: Option<RunDefaults>,
    /// Model calls of the run at most (posted with its message; up to the agent's
    /// [`AgentSpec::step_ceiling`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// The run's system prompt in place of the agent's (the OpenAI-compatible routes'
    /// instructions, by an admin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Appended to the agent's system prompt for this run (a message's `instructions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_instructions: Option<String>,
    /// Conditions that end the run after a step, beside the agent's (posted with its message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_conditions: Option<Vec<StopCondition>>,
    /// Levels of agent calls the run may start below itself (posted with its message; up to
    /// the agent's `limits.max_call_depth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_call_depth: Option<u32>,
    /// Client tools the run offers beside the agent's (the function `tools` of an
    /// OpenAI-compatible request): a call pauses the run as `requires_action`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_tools: Option<Vec<ClientToolSpec>>,
    /// `false`: at most one tool call per model call (asked of the provider, and any further
    /// call dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// The form of the run's final answer in place of the agent's `response_format` (posted
    /// through the OpenAI-compatible routes' `text.format` / `response_format`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// How every model call of the run samples, in place of the agent's settings (posted
    /// through the OpenAI-compatible routes' `temperature`, `top_p`, `max_output_tokens` and
    /// `reasoning`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<Sampling>,
}

/// The sampling settings a request asks of a run's model calls; absent fields leave the
/// agent's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Sampling temperature (0 to 2), in place of the agent's `temperature`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Tokens the model may generate per call (at most the agent's `limits.max_output_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// How much the model reasons (`minimal`, `low`, `medium`, `high`, ...; sent to the
    /// provider as its reasoning effort).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
}

impl Sampling {
    /// Each setting from `self`, else from `earlier`.
    #[must_use]
    pub fn or(self, earlier: Option<Self>) -> Self {
        let earlier = earlier.unwrap_or_default();
        Self {
            temperature: self.temperature.or(earlier.temperature),
            top_p: self.top_p.or(earlier.top_p),
            max_output_tokens: self.max_output_tokens.or(earlier.max_output_tokens),
            reasoning_effort: self.reasoning_effort.or(earlier.reasoning_effort),
        }
    }

    /// The tokens a model call may generate: these settings' limit within the agent's.
    pub fn max_output_tokens(&self, agent: Option<u32>) -> Option<u32> {
        match (self.max_output_tokens, agent) {
            (Some(asked), Some(limit)) => Some(asked.min(limit)),
            (asked, limit) => asked.or(limit),
        }
    }
}

/// The longest `instructions` a message may post, in bytes.
pub const MAX_INSTRUCTIONS_BYTES: usize = 65_536;

/// Defaults for the rest of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunDefaults {
    /// The tool choice of every later step without a rule.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// The tools offered in every later step without a rule (names; replaces the agent's
    /// `active_tools`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_tools: Option<Vec<String>>,
}

impl RunOverrides {
    /// What the run keeps once these overrides answer a pause whose next model call is
    /// `next_step`: the next-step choice becomes a rule for that step, the posted rules go ahead
    /// of those posted at earlier pauses, and the newest default tool choice wins. What earlier
    /// pauses posted lasts for the rest of the run, except their next-step choices, which
    /// applied to steps already taken.
    pub fn accumulate(self, earlier: Option<Self>, next_step: u32) -> Self {
        let earlier = earlier.unwrap_or_default();
        let mut rules = Vec::new();
        if self.tool_choice.is_some() || self.active_tools.is_some() {
            rules.push(StepRule {
                step: next_step,
                tool_choice: self.tool_choice,
                active_tools: self.active_tools,
            });
        }
        rules.extend(self.step_rules.into_iter().flatten());
        rules.extend(earlier.step_rules.into_iter().flatten());
        // Each default from the newest overrides that set it.
        let (new, old) = (
            self.defaults.unwrap_or_default(),
            earlier.defaults.unwrap_or_default(),
        );
        let defaults = RunDefaults {
            tool_choice: new.tool_choice.or(old.tool_choice),
            active_tools: new.active_tools.or(old.active_tools),
        };
        Self {
            tool_choice: None,
            active_tools: None,
            step_rules: (!rules.is_empty()).then_some(rules),
            defaults: (defaults != RunDefaults::default()).then_some(defaults),
            max_steps: self.max_steps.or(earlier.max_steps),
            instructions: self.instructions.or(earlier.instructions),
            extra_instructions: self.extra_instructions.or(earlier.extra_instructions),
            stop_conditions: self.stop_conditions.or(earlier.stop_conditions),
            max_call_depth: self.max_call_depth.or(earlier.max_call_depth),
            client_tools: self.client_tools.or(earlier.client_tools),
            parallel_tool_calls: self.parallel_tool_calls.or(earlier.parallel_tool_calls),
            response_format: self.response_format.or(earlier.response_format),
            sampling: match (self.sampling, earlier.sampling) {
                (None, earlier) => earlier,
                (Some(new), earlier) => Some(new.or(earlier)),
            },
        }
    }

    /// The model calls of a run of `agent` with these overrides at most: the message's
    /// `max_steps` within the agent's ceiling, else the agent's default.
    pub fn run_steps(&self, agent: &AgentSpec) -> u32 {
        self.max_steps.map_or_else(
            || agent.default_steps(),
            |steps| steps.min(agent.step_ceiling()),
        )
    }

    /// The client tools whose names the agent's own tools (or other client tools) already
    /// use: the model could not tell them apart.
    pub fn client_tool_collisions(&self, agent: &AgentSpec) -> Vec<FieldError> {
        let mut seen: std::collections::HashSet<&str> =
            agent.tools.iter().map(ToolSpec::name).collect();
        let mut problems = Vec::new();
        for (i, tool) in self.client_tools.iter().flatten().enumerate() {
            if !seen.insert(tool.name.as_str()) {
                problems.push(FieldError {
                    field: format!("client_tools[{i}].name"),
                    message: format!(
                        "`{}` is the name of another tool of this run (the agent's or another \
                         function)",
                        tool.name
                    ),
                });
            }
        }
        problems
    }

    /// Every step from `next_step` on whose rules, with these (accumulated) overrides applied
    /// to `agent`, choose a named tool that is not among that step's active tools: a choice
    /// posted at one pause and tools narrowed at another can clash, and the provider refuses
    /// the call.
    pub fn clashes(&self, agent: &AgentSpec, next_step: u32) -> Vec<FieldError> {
        let mut spec = agent.clone();
        self.clone().apply(&mut spec);
        let mut steps: Vec<u32> = spec
            .step_rules
            .iter()
            .map(|r| r.step)
            .filter(|s| *s >= next_step)
            .collect();
        steps.sort_unstable();
        steps.dedup();
        let mut clashes: Vec<FieldError> = steps
            .into_iter()
            .filter_map(|step| {
                let name = spec.rules_for(step).clash()?;
                Some(FieldError {
                    field: "step_rules".into(),
                    message: format!(
                        "at step {step}, with the rules posted earlier, `{name}` would be chosen \
                         but is not among the active tools"
                    ),
                })
            })
            .collect();
        // The steps without rules: the (default) tool choice against the active tools.
        if let Some(name) = spec.rules_for(u32::MAX).clash() {
            clashes.push(FieldError {
                field: "defaults".into(),
                message: format!(
                    "`{name}` would be chosen on steps without rules but is not among the \
                     active tools"
                ),
            });
        }
        clashes
    }

    /// Applies what a run keeps (see [`Self::accumulate`], which pinned every next-step choice
    /// to its step) to the spec it executes: the rules go ahead of the agent's, and the default
    /// tool choice replaces the agent's.
    pub fn apply(self, spec: &mut AgentSpec) {
        if let Some(rules) = self.step_rules {
            spec.step_rules.splice(0..0, rules);
        }
        let defaults = self.defaults.unwrap_or_default();
        if let Some(choice) = defaults.tool_choice {
            spec.tool_choice = choice;
        }
        if let Some(active) = defaults.active_tools {
            spec.active_tools = Some(active);
        }
        if let Some(max_steps) = self.max_steps {
            spec.max_steps = max_steps.min(spec.step_ceiling());
        }
        if let Some(depth) = self.max_call_depth {
            spec.limits.max_call_depth = Some(depth.min(spec.limits.call_depth()));
        }
        if let Some(conditions) = self.stop_conditions {
            spec.stop_conditions.extend(conditions);
        }
        if let Some(instructions) = self.instructions {
            spec.instructions = instructions;
        }
        if let Some(extra) = self.extra_instructions {
            if !spec.instructions.is_empty() {
                spec.instructions.push_str("\n\n");
            }
            spec.instructions.push_str(&extra);
        }
        if let Some(tools) = self.client_tools {
            spec.tools.extend(tools.into_iter().map(ToolSpec::Client));
        }
        if let Some(format) = self.response_format {
            spec.response_format = Some(format);
        }
        if let Some(sampling) = self.sampling {
            if sampling.temperature.is_some() {
                spec.temperature = sampling.temperature;
            }
            spec.limits.max_output_tokens =
                sampling.max_output_tokens(spec.limits.max_output_tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{overrides, spec};
    use super::*;
    use serde_json::json;

    #[test]
    fn overrides_posted_at_later_pauses_add_to_those_of_earlier_ones() {
        let first = overrides(json!({"tool_choice": "read", "step_rules": [{"step": 5,
            "tool_choice": "none"}], "defaults": {"tool_choice": "required"}}))
        .accumulate(None, 2);
        let second = overrides(json!({"active_tools": [], "step_rules": [{"step": 5,
            "tool_choice": "auto"}]}))
        .accumulate(Some(first), 4);
        let rules: Vec<(u32, Option<ToolChoice>, Option<usize>)> = second
            .step_rules
            .iter()
            .flatten()
            .map(|r| {
                (
                    r.step,
                    r.tool_choice.clone(),
                    r.active_tools.as_ref().map(Vec::len),
                )
            })
            .collect();
        assert_eq!(
            rules,
            [
                (4, None, Some(0)),
                (5, Some(ToolChoice::Auto), None),
                (2, Some(ToolChoice::Tool("read".into())), None),
                (5, Some(ToolChoice::None), None),
            ],
            "newest first, each next-step choice pinned to its step"
        );
        assert_eq!(second.tool_choice, None);
        assert_eq!(
            second.defaults.and_then(|d| d.tool_choice),
            Some(ToolChoice::Required),
            "the defaults of the first pause last"
        );
    }

    #[test]
    fn a_message_s_overrides_last_through_later_pauses_and_apply_to_every_step() {
        let agent = spec(json!({"name": "a", "model": "demo", "max_steps": 10,
            "instructions": "agent", "active_tools": ["read"],
            "tools": [{"type": "client", "name": "read"}, {"type": "client", "name": "list"}]}));
        let message = overrides(json!({"defaults": {"active_tools": ["list"]},
            "max_steps": 4, "instructions": "message"}));
        assert_eq!(message.validate(&agent, 1), []);
        let paused = overrides(json!({"defaults": {"tool_choice": "list"}}))
            .accumulate(Some(message.accumulate(None, 1)), 3);
        let defaults = paused.defaults.clone().unwrap_or_default();
        assert_eq!(defaults.active_tools, Some(vec!["list".to_owned()]));
        assert_eq!(defaults.tool_choice, Some(ToolChoice::Tool("list".into())));
        assert_eq!(paused.clashes(&agent, 3), []);
        let mut run = agent.clone();
        paused.apply(&mut run);
        assert_eq!((run.max_steps, run.instructions.as_str()), (4, "message"));
        assert_eq!(run.rules_for(2).active, Some(&["list".to_owned()][..]));
        // A max_steps above the agent's does not raise it.
        let mut capped = agent.clone();
        overrides(json!({"max_steps": 50})).apply(&mut capped);
        assert_eq!(capped.max_steps, 10);
        // A default choice outside the default tools clashes on the steps without rules.
        let clash = overrides(json!({"defaults": {"tool_choice": "read"}})).accumulate(
            Some(overrides(json!({"defaults": {"active_tools": ["list"]}}))),
            2,
        );
        assert_eq!(clash.clashes(&agent, 2)[0].field, "defaults");
    }

    #[test]
    fn a_choice_from_one_pause_and_tools_narrowed_at_another_clash() {
        let agent = spec(json!({"name": "a", "model": "demo", "tools": [
            {"type": "client", "name": "read"}, {"type": "client", "name": "list"}]}));
        let first = overrides(json!({"step_rules": [{"step": 3, "tool_choice": "read"}]}))
            .accumulate(None, 2);
        assert_eq!(first.clashes(&agent, 2), []);
        let narrowed =
            overrides(json!({"active_tools": ["list"]})).accumulate(Some(first.clone()), 3);
        let clashes = narrowed.clashes(&agent, 3);
        assert_eq!(clashes.len(), 1, "{clashes:?}");
        assert!(clashes[0].message.contains("at step 3"), "{clashes:?}");
        let widened =
            overrides(json!({"active_tools": ["list", "read"]})).accumulate(Some(first), 3);
        assert_eq!(widened.clashes(&agent, 3), []);
    }

    #[test]
    fn overrides_become_rules_ahead_of_the_agent_s_and_absent_ones_change_nothing() {
        let agent = spec(
            json!({"name": "a", "model": "demo", "tool_choice": "required",
            "tools": [{"type": "client", "name": "read"}],
            "step_rules": [{"step": 2, "tool_choice": "read"}]}),
        );
        let mut unchanged = agent.clone();
        // What the API stores when nothing is overridden.
        overrides(
            json!({"tool_choice": null, "active_tools": null, "step_rules": null,
            "defaults": null}),
        )
        .accumulate(None, 2)
        .apply(&mut unchanged);
        assert_eq!(unchanged, agent);

        let mut steered = agent.clone();
        overrides(
            json!({"tool_choice": "none", "step_rules": [{"step": 3, "active_tools": []}],
            "defaults": {"tool_choice": "auto"}}),
        )
        .accumulate(None, 2)
        .apply(&mut steered);
        assert_eq!(steered.tool_choice, ToolChoice::Auto);
        let rules: Vec<(u32, Option<ToolChoice>)> = steered
            .step_rules
            .iter()
            .map(|r| (r.step, r.tool_choice.clone()))
            .collect();
        assert_eq!(
            rules,
            [
                (2, Some(ToolChoice::None)),
                (3, None),
                (2, Some(ToolChoice::Tool("read".into()))),
            ]
        );
    }

    #[test]
    fn a_message_s_controls_are_kept_with_the_run_and_applied_within_the_agent_s_bounds() {
        let agent = spec(
            json!({"name": "a", "model": "demo", "instructions": "Agent.",
            "max_steps": 3, "limits": {"max_steps": 8, "max_call_depth": 2},
            "tools": [{"type": "client", "name": "done"}]}),
        );
        let message = overrides(json!({"max_steps": 6, "max_call_depth": 1,
            "extra_instructions": "Message.",
            "stop_conditions": [{"type": "has_tool_call", "tool_name": "done"}],
            "step_rules": [{"step": 5, "tool_choice": {"type": "tool", "tool_name": "done"}}]}));
        assert_eq!(message.validate(&agent, 1), []);
        // Stored with the run as JSON and read back by every attempt: the same overrides.
        let stored: RunOverrides =
            serde_json::from_value(serde_json::to_value(&message).expect("json")).expect("read");
        assert_eq!(stored, message);
        // Kept through a pause's answer.
        let kept = RunOverrides::default().accumulate(Some(stored), 2);
        assert_eq!(kept.run_steps(&agent), 6);
        let mut run = agent.clone();
        kept.apply(&mut run);
        assert_eq!(
            run.max_steps, 6,
            "raised above max_steps, within the ceiling"
        );
        assert_eq!(run.limits.max_call_depth, Some(1));
        assert_eq!(run.instructions, "Agent.\n\nMessage.");
        assert_eq!(run.stop_conditions.len(), 1);
        assert_eq!(
            run.rules_for(5).choice,
            &ToolChoice::Tool("done".into()),
            "the object form names the tool"
        );
        // Past the agent's bounds: refused by field.
        let beyond = overrides(json!({"max_steps": 9, "max_call_depth": 3,
            "stop_conditions": [{"type": "has_tool_call", "tool_name": "ghost"}],
            "step_rules": [{"step": 9}]}));
        let fields: Vec<String> = beyond
            .validate(&agent, 1)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(
            fields,
            [
                "max_steps",
                "max_call_depth",
                "stop_conditions[0].tool_name",
                "step_rules[0].step"
            ]
        );
        // Without a message's max_steps, the agent's within its ceiling.
        let capped = spec(json!({"name": "a", "model": "demo", "max_steps": 10,
            "limits": {"max_steps": 4}}));
        assert_eq!(RunOverrides::default().run_steps(&capped), 4);
        assert_eq!(RunOverrides::default().run_steps(&agent), 3);
    }

    #[test]
    fn client_tools_join_the_run_and_may_not_take_an_agent_tools_name() {
        let agent = spec(json!({"name": "a", "model": "m", "tools": [
            {"type": "client", "name": "read"}]}));
        let posted = overrides(json!({"client_tools": [{"name": "get_weather"},
            {"name": "read"}], "parallel_tool_calls": false}));
        let collisions = posted.client_tool_collisions(&agent);
        assert_eq!(collisions.len(), 1);
        assert_eq!(collisions[0].field, "client_tools[1].name");
        // Kept at later pauses, and offered to the model.
        let kept = RunOverrides::default().accumulate(Some(posted), 3);
        assert_eq!(kept.parallel_tool_calls, Some(false));
        let mut run = agent.clone();
        kept.apply(&mut run);
        let names: Vec<&str> = run.tools.iter().map(ToolSpec::name).collect();
        assert_eq!(names, ["read", "get_weather", "read"]);
    }

    #[test]
    fn sampling_replaces_the_agent_s_within_its_output_limit_and_lasts_through_pauses() {
        let agent = spec(json!({"name": "a", "model": "m", "temperature": 0.9,
            "limits": {"max_output_tokens": 500}}));
        let posted = overrides(json!({"sampling": {"temperature": 0.1, "top_p": 0.5,
            "max_output_tokens": 900, "reasoning_effort": "low"}}));
        // A later pause that posts only a temperature keeps the rest.
        let kept = overrides(json!({"sampling": {"temperature": 0.3}})).accumulate(Some(posted), 2);
        let sampling = kept.sampling.clone().expect("sampling");
        assert_eq!(sampling.temperature, Some(0.3));
        assert_eq!(sampling.top_p, Some(0.5));
        assert_eq!(sampling.reasoning_effort.as_deref(), Some("low"));
        let mut run = agent.clone();
        kept.apply(&mut run);
        assert_eq!(run.temperature, Some(0.3));
        assert_eq!(
            run.limits.max_output_tokens,
            Some(500),
            "never above the agent's"
        );
        let mut lower = agent.clone();
        overrides(json!({"sampling": {"max_output_tokens": 64}})).apply(&mut lower);
        assert_eq!(
            (lower.limits.max_output_tokens, lower.temperature),
            (Some(64), Some(0.9))
        );
    }
}
