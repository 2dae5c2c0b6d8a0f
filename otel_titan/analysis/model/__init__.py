"""The model of a run, built once per read: spans paired into a timeline, steps, per-process facts,
clock alignment, and the rules that define a straggler, a stall, a step."""
