"""What if these heads were shortened: a model run as it is and with chosen heads restricted (streaming, a
window, a head removed), the heads ranked by what restricting each alone costs, policies of a share of heads
checked on held-out texts, and the files serving stacks read (DuoAttention, MInference, retrieval scores).

torch and transformers are imported inside the functions that run a model; the exports and the needle suite
need NumPy only.
"""
