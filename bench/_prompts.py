"""Open-ended prompts for the engine benchmarks: each invites a long answer, so rows decode to the token cap."""

QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List some uses of a paperclip.",
    "Describe the water cycle to a child.",
    "What should I pack for a weekend of hiking?",
    "Give me three ideas for a birthday party.",
    "How do airplanes fly?",
    "Summarize the plot of a mystery novel you invent.",
]
