"""The review loop (issue 12): clinicians confirm, correct and flag; the core re-derives the decision
with no LLM call; trial owners revise programs; `verdict match rescreen` re-decides stored patients.

    protocol.py   request / response models (changes, history, revisions, flags)
    serving.py    ReviewService: review, history, revise, flags (serve/dependencies.py: Reviews)
    rederive.py   stored resolved patient + changes -> re-resolved patient (reviews and rescreens alike)
    rescreen.py   re-deciding stored decisions after a policy or program version change
    router.py     the HTTP routes
"""
