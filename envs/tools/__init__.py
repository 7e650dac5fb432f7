"""Tools the model can call inside a sandbox: bash, str_replace_editor, python (notebook-like), submit."""

from envs.tools.bash import BashTool
from envs.tools.editor import EditorTool
from envs.tools.parsing import parse_action
from envs.tools.python import PythonTool
from envs.tools.submit import SubmitTool

__all__ = ["BashTool", "EditorTool", "PythonTool", "SubmitTool", "parse_action"]
