"""Fixed small vocabularies shared by the word-based suites (keeps the tokenizer tiny)."""

NAMES: tuple[str, ...] = (
    "Ann", "Bob", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal",
    "Ida", "Jon", "Kim", "Lee", "Max", "Ned", "Oli", "Pam",
)

NOUNS: tuple[str, ...] = ("apples", "pens", "books", "cards", "eggs", "cups", "balls", "shells")
