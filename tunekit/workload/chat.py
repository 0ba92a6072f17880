"""How a row's prompt reaches the model, the same way in every runner: through the tokenizer's chat template (the
prompt as the user's turn, after ``task.system_prompt`` when set, with the generation prompt added) or as it is.

tunekit's loop renders the text and tokenizes it (:meth:`PromptFormat.render`); TRL gets the messages as a
conversational ``prompt`` column, verl as its dataset's ``prompt`` list, and each applies the same template itself.
The reward always receives the row's prompt text and the response as plain text.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

from tunekit.config import TaskConfig

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class PromptFormat:
    """``chat``: through the tokenizer's chat template; otherwise the text as it is."""

    chat: bool
    system_prompt: str | None = None

    def messages(self, text: str) -> Messages:
        """The conversation for ``text``: the system turn (with a chat template and a system prompt), then the user's."""
        system = [{"role": "system", "content": self.system_prompt}] if self.chat and self.system_prompt else []
        return system + [{"role": "user", "content": text}]

    def render(self, tokenizer, text: str) -> str:
        """The text the model is fed for ``text`` (tokenized without adding special tokens)."""
        if not self.chat:
            return text
        return tokenizer.apply_chat_template(self.messages(text), tokenize=False, add_generation_prompt=True)

    def row(self, text: str) -> str | Messages:
        """A conversational dataset's ``prompt`` for ``text`` (TRL's format): messages with a template, else the text."""
        return self.messages(text) if self.chat else text


def prompt_format(task: TaskConfig, tokenizer) -> PromptFormat:
    """``task.chat_template`` against ``tokenizer``: ``auto`` uses its chat template when it has one and otherwise
    feeds the text as it is, saying so once."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if task.chat_template == "auto" and not has:
        say_once(f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template, so prompts are fed "
                  "as they are (task.chat_template auto)")
    chat = task.chat_template == "auto" and has
    if task.system_prompt and not chat:
        say_once("task.system_prompt is not used: without a chat template there is no system turn to put it in "
                  "(write it into task.prompt_template instead)")
    return PromptFormat(chat=chat, system_prompt=task.system_prompt)


@functools.cache
def say_once(message: str) -> None:
    """One line to the user (standard error), once per process for each message."""
    print(f"[tunekit] {message}", file=sys.stderr, flush=True)
