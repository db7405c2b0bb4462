"""Data shipped with the course: the MiniLM-L6 attention-score statistics (``minilm_scores.json``)."""
