"""Tools the model can call inside a sandbox: bash, str_replace_editor, python (notebook-like), submit."""

from sao.envs.tools.bash import BashTool
from sao.envs.tools.editor import EditorTool
from sao.envs.tools.parsing import parse_action
from sao.envs.tools.python import PythonTool
from sao.envs.tools.submit import SubmitTool

__all__ = ["BashTool", "EditorTool", "PythonTool", "SubmitTool", "parse_action"]
