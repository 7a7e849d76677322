"""The tools the live tool-call tests offer, in OpenAI's chat form (get_weather, whose schema each
test chooses, and get_time), and the question that asks for the weather."""
from __future__ import annotations

from typing import Any

TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"]}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def weather_and_time_tools(weather: dict[str, Any]) -> list[dict[str, Any]]:
    """get_weather with `weather` as its parameters schema, then get_time with TIME."""
    return [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                              "parameters": weather}},
            {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                              "parameters": TIME}}]
