"""Write `dflash_et/data/assistant_prompts.jsonl`: prompts like those a real chat assistant gets.

Why: the built-in corpus (dflash_et/data/corpus.py) is made for the tiny built-in targets and is
three templates with numbers swapped. A real pretrained chat model (SmolLM2-135M-Instruct, Qwen3)
answers far more varied requests, and a draft trained or measured on toy prompts says little about
its acceptance on real use. So this set holds six kinds of everyday request, in varied phrasing,
each answerable in under ~100 tokens by a small instruct model: `math` (arithmetic word problems),
`code` (write, explain or fix a small Python function), `chat` (open questions and advice),
`summarize` (a 60-120 word paragraph given in the prompt), `rewrite` (a sentence or short text to
make formal, simpler, shorter, correct, politer or livelier) and `multi-turn` (a user turn, a short
assistant reply, and a follow-up for the model to answer).

Disjoint by construction: every piece of content (names, story problems, function tasks, code
snippets, topics, questions, paragraphs, sentences, conversations) lives in a `{"train": [...],
"eval": [...]}` pool, and a row of a split is built only from its split's pool, so a draft trained
on `train` never saw the content of an `eval` prompt. Only the instruction phrasings ("Summarize
this paragraph in one sentence:", "Show your working.") and the generic multi-turn follow-ups are
shared, as they would be between any two users; `SHARED_PHRASINGS` lists them. `check_disjoint`
refuses a pool whose splits share an item, and tests/test_assistant_prompts.py checks the output:
once that shared phrasing is taken out, no eval prompt shares an 8-word run with a train prompt.

Deterministic: each (category, split) draws from its own seeded `random.Random`, so editing one
pool reshuffles only that pool's rows; no network, no models. Run from the repository root:

    python tools/make_assistant_prompts.py [--out PATH]
"""

import argparse
import json
import random
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

OUT = Path(__file__).resolve().parent.parent / "dflash_et" / "data" / "assistant_prompts.jsonl"
SEED = 2024
SPLITS = ("train", "eval")
# Rows per piece of content: train reuses a piece under several phrasings, to reach ~880 rows;
# eval uses each piece once, so that its ~96 rows are as varied as possible.
TRAIN_REUSE = {"math": 2, "code-write": 2, "summarize": 3, "multi-turn": 3}

# ---------------------------------------------------------------------------------------------
# math: story problems. {name} and {other} are two different people; numbers come from `numbers`:
# {a} 20-90, {b} 2-19 (so a - b > 0), {c} 2-9, {m} a multiple of {c}, {p} a price of 2-15.

NAMES = {
    "train": ["Amara", "Bruno", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Isla", "Jamal",
              "Keiko", "Liam", "Maya", "Nikhil", "Olivia", "Pablo", "Quinn", "Rosa", "Samir", "Tara",
              "Umar", "Vera", "Wes", "Ximena", "Yusuf", "Zoe", "Aiden", "Bea", "Carlos", "Dina",
              "Emil", "Fatima", "Gabe", "Hannah", "Ines", "Jonas", "Kara", "Leo", "Mina", "Noah"],
    "eval": ["Priya", "Tomas", "Anya", "Kofi", "Lucia", "Marcus", "Nadia", "Oscar", "Rhea", "Stefan",
             "Thea", "Victor", "Wren", "Yara", "Zane", "Esme"],
}

MATH = {
    "train": [
        "{name} has {a} stickers and gives {b} of them to a friend. How many stickers are left?",
        "A bakery makes {a} muffins in the morning and sells {b} before noon. How many muffins are left?",
        "{name} buys {c} notebooks at ${p} each. How much does {name} spend in total?",
        "There are {c} shelves in a bookcase and each shelf holds {b} books. How many books fit in the bookcase?",
        "{name} shares {m} grapes equally among {c} children. How many grapes does each child get?",
        "A bus has {a} passengers. At the next stop {b} people get off. How many passengers are still on the bus?",
        "{name} saves ${b} every week. How much money will {name} have saved after {c} weeks?",
        "A garden has {c} rows of tomato plants with {b} plants in each row. How many tomato plants are there?",
        "{name} ran {b} kilometres on Monday and {c} kilometres on Tuesday. How far did {name} run over the two days?",
        "A class of {m} students is split into {c} equal teams. How many students are on each team?",
        "{name} had ${a} and spent ${b} on lunch. How much money does {name} have left?",
        "A box holds {b} crayons. How many crayons are in {c} boxes?",
        "{name} is {b} years old. {other} is {c} years older. How old is {other}?",
        "A train travels at {a} kilometres per hour. How far does it go in {c} hours?",
        "{name} picks {a} apples and {other} picks {b} apples. How many apples do they pick altogether?",
        "A pizza is cut into {c} slices. If {name} orders {b} pizzas for a party, how many slices are there?",
        "The temperature was {b} degrees in the morning and rose by {c} degrees by the afternoon. "
        "What was the afternoon temperature?",
        "{name} has {m} marbles and puts them into {c} bags with the same number in each. "
        "How many marbles go in each bag?",
        "A ticket to the museum costs ${p}. How much do {c} tickets cost?",
        "{name} read {b} pages yesterday and {a} pages today. How many pages is that in total?",
        "A farmer has {a} chickens and sells {b} of them at the market. How many chickens does the farmer keep?",
        "There are {b} cars in a parking lot, and each car has 4 wheels. How many wheels are there in total?",
        "{name} drinks {c} glasses of water a day. How many glasses is that in a week?",
        "A movie is {a} minutes long and {name} has watched {b} minutes of it. How many minutes are left?",
        "A pack of pens costs ${p}. {name} buys {c} packs with a $200 gift card. How much is left on the card?",
        "{name} walks {b} blocks to school and the same distance back home. How many blocks is that each day?",
        "A library had {a} books and received a donation of {b} more. How many books does it have now?",
        "{name} plants {m} seeds in {c} pots, the same number in each pot. How many seeds are in each pot?",
        "A shop sold {a} bottles of juice on Saturday and {b} fewer on Sunday. How many bottles did it sell on Sunday?",
        "{name} scored {b} points in the first game and {c} points in the second. What was the total score?",
        "A recipe needs {c} eggs for one cake. How many eggs are needed for {b} cakes?",
        "{name} is saving for a bike that costs ${a}. So far {name} has ${b}. How much more is needed?",
        "There are {m} cookies in a jar, shared equally by {c} friends. How many cookies does each friend get?",
        "A spider has 8 legs. How many legs do {b} spiders have?",
        "{name} practises piano for {b} minutes a day. How many minutes is that over {c} days?",
        "A school orders {c} boxes of chalk with {b} sticks in each box. How many sticks of chalk arrive?",
        "{name} had {a} emails in the inbox and deleted {b}. How many emails remain?",
        "An aquarium has {b} goldfish and {c} angelfish. How many fish are there in total?",
        "A rope is {a} metres long. {name} cuts off {b} metres. How long is the rest of the rope?",
        "{name} earns ${p} an hour babysitting. How much does {name} earn for {c} hours?",
        "A parking garage has {c} floors with {a} spaces on each floor. How many spaces are there?",
        "{c} friends split a ${m} restaurant bill equally. How much does each friend pay?",
        "A hen lays {c} eggs a week. How many eggs does it lay in {b} weeks?",
        "{name} blew up {b} red balloons and {c} blue balloons, then {c} of them popped. "
        "How many balloons are left?",
        "A printer prints {b} pages per minute. How many pages does it print in {c} minutes?",
        "{name} bought a jacket for ${a} and a hat for ${b}. What was the total cost?",
        "A cinema has {c} rows with {b} seats in each row. How many people can it seat?",
        "{name} collected {a} shells at the beach and gave {b} to {other}. How many shells does {name} have now?",
        "A water tank holds {a} litres. After {b} litres are used, how much water is left?",
        "{name} cycles {c} kilometres each way to work. How many kilometres is that in a five-day week?",
        "A teacher has {m} pencils to hand out equally to {c} tables. How many pencils does each table get?",
        "A puzzle has {a} pieces and {name} has placed {b} of them. How many pieces are still to be placed?",
        "A shirt costs ${a} and is on sale for ${b} off. What is the sale price?",
        "{name} feeds the cat {c} times a day. How many feedings is that in {b} days?",
        "There are {b} ducks on a pond and {c} more land on it. How many ducks are on the pond now?",
        "A gardener waters {c} plants every minute. How long does it take to water {m} plants?",
        "{name} has {c} packs of cards with {b} cards in each pack. How many cards does {name} have?",
        "A flight leaves at 9:00 in the morning and lasts {c} hours. What time does it land?",
        "{name} made {a} paper cranes last month and {b} this month. How many more were made last month?",
        "A jar contains {a} coins. {name} adds {b} more and then takes out {c}. How many coins are in the jar?",
        "The school play sold {a} adult tickets and {b} child tickets. How many tickets were sold in all?",
        "{name} needs {m} tiles for a floor, and the tiles come in boxes of {c}. How many boxes should {name} buy?",
        "A candle burns for {a} minutes. It has been burning for {b} minutes. How many minutes until it burns out?",
        "{name} buys {c} sandwiches at ${p} each and one drink for $2. What is the total cost?",
        "A zoo has {b} monkeys and {c} times as many birds. How many birds does the zoo have?",
        "{name} swims {b} lengths of the pool every day. How many lengths does {name} swim in {c} days?",
        "A bag of rice weighs {b} kilograms. How much do {c} bags weigh?",
        "{name} had {a} stamps and bought {b} more at a fair. How many stamps does {name} have now?",
        "A class raised ${a} on Monday and ${b} on Tuesday for charity. How much did they raise in total?",
        "{name} has {a} minutes to finish a test and has used {b}. How much time is left?",
        "A bookshop orders {c} crates with {b} books per crate and sells {b} books on the first day. "
        "How many books are left?",
        "{name} can type {a} words a minute. How many words can {name} type in {c} minutes?",
        "There are {m} chairs to set out in {c} equal rows. How many chairs go in each row?",
        "{name} bakes {c} trays of cookies with {b} cookies on each tray and gives {c} cookies to {other}. "
        "How many cookies are left?",
    ],
    "eval": [
        "A carpenter has {a} nails and uses {b} to build a birdhouse. How many nails are left?",
        "{name} buys {c} kites at ${p} each. What is the total price?",
        "A hotel has {c} floors with {b} rooms on each floor. How many rooms does the hotel have?",
        "{name} divides {m} strawberries evenly into {c} bowls. How many strawberries are in each bowl?",
        "A ferry carries {a} passengers on its first trip and {b} on its second. "
        "How many passengers did it carry?",
        "{name} knits {c} scarves each month. How many scarves does {name} knit in {b} months?",
        "A hiking trail is {a} kilometres long. {name} has hiked {b} kilometres. "
        "How much farther is the end of the trail?",
        "{name} has ${a} in a piggy bank and {other} has ${b}. How much more does {name} have?",
        "A florist puts {b} roses in each bouquet and makes {c} bouquets. How many roses does the florist use?",
        "A choir of {m} singers stands in {c} equal rows. How many singers are in each row?",
        "{name} downloads {b} songs a day for {c} days. How many songs is that?",
        "A lamp costs ${a} and a bulb costs ${p}. {name} buys the lamp and {c} bulbs. What is the total?",
        "An orchard has {c} rows of pear trees with {b} trees per row. How many pear trees are there?",
        "{name} had {a} postcards and mailed {b} of them. How many postcards are left?",
        "A snail climbs {c} centimetres every hour. How far does it climb in {b} hours?",
        "A bakery packs {m} bagels into bags of {c}. How many bags does it fill?",
    ],
}

MATH_ASKS = [
    "{}",
    "{} Show your working.",
    "Can you help me solve this? {}",
    "Word problem: {}",
    "{} Please explain the steps briefly.",
    "Here's a homework question I'm stuck on: {}",
    "Solve this step by step: {}",
    "{} Just give me the answer with one line of working.",
]

# ---------------------------------------------------------------------------------------------
# code: functions to write (signature, what it does), snippets to explain, buggy snippets to fix
# (what it should do, the code).

WRITE_TASKS = {
    "train": [
        ("is_palindrome(text)", "checks whether a string reads the same backwards, ignoring case"),
        ("count_vowels(text)", "counts the vowels in a string"),
        ("fizzbuzz(n)", "returns 'Fizz', 'Buzz', 'FizzBuzz' or the number itself as a string for a given n"),
        ("second_largest(numbers)", "returns the second largest number in a list"),
        ("celsius_to_fahrenheit(c)", "converts a temperature from Celsius to Fahrenheit"),
        ("word_count(sentence)", "returns the number of words in a sentence"),
        ("reverse_words(sentence)", "reverses the order of the words in a sentence"),
        ("is_prime(n)", "tells whether a positive integer is prime"),
        ("flatten(nested)", "flattens a list of lists into a single list"),
        ("unique(items)", "removes duplicates from a list while keeping the original order"),
        ("factorial(n)", "computes n factorial without recursion"),
        ("average(numbers)", "returns the average of a list of numbers, or None for an empty list"),
        ("capitalize_words(text)", "capitalizes the first letter of every word"),
        ("char_frequency(text)", "returns a dict mapping each character to how often it appears"),
        ("is_leap_year(year)", "decides whether a year is a leap year"),
        ("merge_dicts(a, b)", "merges two dictionaries, with values from the second winning on conflicts"),
        ("clamp(x, low, high)", "limits a number to lie between a lower and an upper bound"),
        ("digit_sum(n)", "adds up the digits of a non-negative integer"),
        ("longest_word(sentence)", "returns the longest word in a sentence"),
        ("chunk(items, size)", "splits a list into pieces of a given size"),
        ("is_anagram(a, b)", "checks whether two words are anagrams of each other"),
        ("fibonacci(n)", "returns the first n Fibonacci numbers as a list"),
        ("count_evens(numbers)", "counts how many numbers in a list are even"),
        ("snake_to_camel(name)", "turns a snake_case name into camelCase"),
        ("remove_punctuation(text)", "strips all punctuation from a string"),
        ("max_gap(numbers)", "returns the largest difference between two neighbouring numbers in a list"),
        ("rotate(items, k)", "rotates a list to the right by k positions"),
        ("initials(full_name)", "returns the initials of a person's full name in upper case"),
        ("gcd(a, b)", "finds the greatest common divisor of two integers"),
        ("is_sorted(numbers)", "checks whether a list is sorted in ascending order"),
        ("seconds_to_hms(seconds)", "formats a number of seconds as hours:minutes:seconds"),
        ("count_lines(path)", "counts the lines in a text file"),
        ("most_common(items)", "returns the most frequent element of a list"),
        ("pairs_summing_to(numbers, target)", "finds all pairs of numbers in a list that add up to a target"),
        ("mask_email(email)", "hides all but the first letter of the part of an email address before the @"),
        ("running_total(numbers)", "returns the running totals of a list, so [1, 2, 3] becomes [1, 3, 6]"),
        ("is_valid_password(password)",
         "checks that a password has at least 8 characters, a digit and an upper-case letter"),
        ("group_by_length(words)", "groups words into a dict keyed by their length"),
        ("truncate(text, limit)", "shortens a string to a maximum length and adds '...' when it was cut"),
        ("binary_search(items, target)", "returns the index of a target in a sorted list, or -1 if it is missing"),
        ("to_binary(n)", "converts a non-negative integer to a binary string without using bin()"),
        ("days_between(first, second)", "returns the number of days between two dates given as 'YYYY-MM-DD' strings"),
        ("median(numbers)", "returns the median of a list of numbers"),
        ("squeeze_spaces(text)", "collapses runs of spaces in a string into a single space"),
        ("common_items(a, b)", "returns the items that appear in both of two lists"),
        ("roman_to_int(numeral)", "converts a Roman numeral such as 'XIV' to an integer"),
        ("swap_case(text)", "swaps upper-case and lower-case letters in a string without using str.swapcase"),
        ("safe_divide(a, b)", "divides two numbers and returns None instead of raising when the divisor is zero"),
        ("read_column(path, column)", "reads a CSV file and returns the values of one column as a list"),
    ],
    "eval": [
        ("is_pangram(text)", "checks whether a sentence uses every letter of the alphabet at least once"),
        ("compress(text)", "run-length encodes a string, so 'aaabcc' becomes 'a3b1c2'"),
        ("kth_smallest(numbers, k)", "returns the k-th smallest number in a list"),
        ("format_price(cents)", "turns an amount in cents into a string like '$12.05'"),
        ("is_valid_ip(address)", "checks whether a string is a valid IPv4 address such as '192.168.0.1'"),
        ("dict_from_lists(keys, values)", "builds a dictionary from a list of keys and a list of values"),
        ("alternate_caps(text)", "returns the text with its letters alternating between upper and lower case"),
        ("hours_worked(start, end)", "returns the hours between two times of the same day given as 'HH:MM'"),
    ],
}

WRITE_ASKS = [
    "Write a Python function {sig} that {task}.",
    "Can you write a short Python function that {task}?",
    "I need a Python function called {name} that {task}. Please keep it simple.",
    "How would I write a function in Python that {task}?",
    "Implement {sig} in Python. It {task}.",
    "Give me a Python function that {task}, with a short docstring.",
    "Please write a Python function that {task}. Add type hints.",
    "Show me a simple Python function that {task}, plus one example call.",
]

EXPLAIN_SNIPPETS = {
    "train": [
        "def f(xs):\n    return [x for x in xs if x % 2 == 0]",
        "def g(s):\n    return s[::-1]",
        "def mystery(n):\n    total = 0\n    while n > 0:\n        total += n % 10\n        n //= 10\n    return total",
        "def h(words):\n    return {w: len(w) for w in words}",
        "def check(a, b):\n    return sorted(a) == sorted(b)",
        "import random\n\ndef pick(items):\n    return items[random.randrange(len(items))]",
        "def count(text, ch):\n    return sum(1 for c in text if c == ch)",
        "def first_dup(items):\n    seen = set()\n    for x in items:\n        if x in seen:\n            return x\n"
        "        seen.add(x)\n    return None",
        "def squares(n):\n    return [i * i for i in range(1, n + 1)]",
        "def wrap(text, width):\n    return [text[i:i + width] for i in range(0, len(text), width)]",
        'with open("notes.txt") as f:\n    lines = [line.strip() for line in f if line.strip()]\nprint(len(lines))',
        "def both(a, b):\n    return list(set(a) & set(b))",
        "def fact(n):\n    return 1 if n <= 1 else n * fact(n - 1)",
        "def norm(values):\n    top = max(values)\n    return [v / top for v in values]",
        "def tally(votes):\n    result = {}\n    for v in votes:\n        result[v] = result.get(v, 0) + 1\n"
        "    return result",
        'def zip_names(first, last):\n    return [f"{a} {b}" for a, b in zip(first, last)]',
        "def pad(n, width=3):\n    return str(n).zfill(width)",
        "def nested_sum(rows):\n    return sum(sum(row) for row in rows)",
        "def swap(d):\n    return {v: k for k, v in d.items()}",
        "def retry(fn, times=3):\n    for attempt in range(times):\n        try:\n            return fn()\n"
        "        except Exception:\n            if attempt == times - 1:\n                raise",
        "numbers = [5, 3, 8, 1]\nnumbers.sort(reverse=True)\nprint(numbers[:2])",
        'def acronym(phrase):\n    return "".join(word[0].upper() for word in phrase.split())',
        "def evens_odds(nums):\n    evens = [n for n in nums if n % 2 == 0]\n    return evens, [n for n in nums if n % 2]",
        "from collections import Counter\n\ndef top3(words):\n    return [w for w, _ in Counter(words).most_common(3)]",
        "def between(x, lo, hi):\n    return lo <= x <= hi",
    ],
    "eval": [
        'def weekday_name(i):\n    return ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"][i % 7]',
        "def longest_run(s):\n    best = run = 1\n    for a, b in zip(s, s[1:]):\n        run = run + 1 if a == b else 1\n"
        "        best = max(best, run)\n    return best",
        "def keep_short(words, limit=4):\n    return [w for w in words if len(w) <= limit]",
        'import json\n\ndef load_settings(path):\n    with open(path) as f:\n        return json.load(f).get("settings", {})',
    ],
}

EXPLAIN_ASKS = [
    "What does this Python code do?\n\n{}",
    "Explain this in one or two sentences:\n\n{}",
    "Can you walk me through what this does?\n\n{}",
    "I found this in an old project. What is it for?\n\n{}",
    "Explain this snippet to a beginner:\n\n{}",
    "{}\n\nWhat does this do, in plain English?",
]

FIX_SNIPPETS = {
    "train": [
        ("return the largest number in a list",
         "def largest(nums):\n    best = 0\n    for n in nums:\n        if n > best:\n            best = n\n    return best"),
        ("return the sum of the numbers from 1 to n", "def total(n):\n    return sum(range(n))"),
        ("return the last element of a list", "def last(items):\n    return items[len(items)]"),
        ("add an item to a list and return it, starting with an empty list on every call",
         "def add_item(item, items=[]):\n    items.append(item)\n    return items"),
        ("check whether a number is even", "def is_even(n):\n    return n % 2 == 1"),
        ("return the average of a list",
         "def average(nums):\n    total = 0\n    for n in nums:\n        total += n\n        return total / len(nums)"),
        ("print the numbers 1 to 10", "for i in range(1, 10):\n    print(i)"),
        ("reverse a string",
         'def reverse(s):\n    result = ""\n    for ch in s:\n        result = result + ch\n    return result'),
        ("tell whether a word is in the list, ignoring case",
         "def contains(words, word):\n    return word.lower() in words"),
        ("build a greeting and print it in capital letters",
         'def greet(name):\n    print("Hello, " + name + "!")\n\ngreeting = greet("Sam")\nprint(greeting.upper())'),
        ("compute a factorial",
         "def factorial(n):\n    if n == 0:\n        return 0\n    return n * factorial(n - 1)"),
        ("remove the negative numbers from a list",
         "def drop_negatives(nums):\n    for n in nums:\n        if n < 0:\n            nums.remove(n)\n    return nums"),
        ("read a number from the user and double it", 'n = input("Number: ")\nprint(n * 2)'),
        ("return the first letter of each word", "def firsts(sentence):\n    return [w[1] for w in sentence.split()]"),
        ("check whether a year is a leap year", "def is_leap(year):\n    return year % 4 == 0"),
        ("find the position of the smallest item", "def argmin(items):\n    return items.index(min(items)) + 1"),
        ("count how many times each letter appears",
         "def letter_counts(text):\n    counts = {}\n    for ch in text:\n        counts[ch] += 1\n    return counts"),
        ("join a list of numbers into a comma-separated string",
         'def join_numbers(nums):\n    return ", ".join(nums)'),
        ("return a copy of a list with every value doubled, leaving the original alone",
         "def doubled(values):\n    out = values\n    for i in range(len(out)):\n        out[i] *= 2\n    return out"),
        ("return the price after a percentage discount",
         "def discounted(price, percent):\n    return price - percent"),
        ("compare two strings without caring about case", "def same(a, b):\n    return a.lower == b.lower"),
        ("stop the loop when the user types quit",
         'while True:\n    cmd = input("> ")\n    if cmd == "quit":\n        continue\n    print("You typed", cmd)'),
        ("return the middle element of a list with an odd length",
         "def middle(items):\n    return items[len(items) / 2]"),
        ("return the number of seconds in a given number of hours", "def seconds(hours):\n    return hours * 60"),
    ],
    "eval": [
        ("check whether all numbers in a list are positive",
         "def all_positive(values):\n    for v in values:\n        if v > 0:\n            return True\n    return False"),
        ("turn a number of minutes into whole hours and leftover minutes, like 135 into (2, 15)",
         "def split_minutes(total):\n    return total / 60, total % 60"),
        ("build a list of the squares of 1 to 5",
         "squares = []\nfor i in range(1, 6):\n    squares.append(i ^ 2)\nprint(squares)"),
        ("return the longer of two strings",
         "def longer(a, b):\n    if len(a) > len(b):\n        return b\n    return a"),
    ],
}

FIX_ASKS = [
    "This should {goal}, but it gives the wrong result. Can you fix it?\n\n{code}",
    "Find and fix the bug. It is supposed to {goal}.\n\n{code}",
    "Why doesn't this work? It should {goal}.\n\n{code}",
    "My code is meant to {goal}, but something is off. What's wrong?\n\n{code}",
    "{code}\n\nThis is supposed to {goal}. Where is the bug?",
]

# ---------------------------------------------------------------------------------------------
# chat: each kind is (phrasings, pool); a phrasing's {} slots take the item (a pair for comparisons).

HOW_TO = ["How do I {}?", "What's a good way to {}?", "I want to {}. Where should I start?",
          "Give me three quick tips to {}.", "Any advice on how to {}?"]
HOW_TO_POOL = {
    "train": ["get better at public speaking", "start running after years of not exercising",
              "keep houseplants alive", "fall asleep faster", "learn to cook simple meals",
              "make my mornings less rushed", "remember people's names", "stay focused while working from home",
              "save money on groceries", "write a good cover letter", "keep a conversation going with someone new",
              "stop putting off big tasks", "learn touch typing", "make friends in a new city",
              "organize a small closet", "prepare for a job interview", "get into the habit of reading",
              "take better photos with my phone", "drink more water during the day", "plan a budget for the month",
              "learn basic guitar chords", "keep my email inbox under control",
              "memorize vocabulary in a new language", "make a long car trip more fun for kids",
              "give useful feedback to a coworker"],
    "eval": ["train a puppy to sit", "start a vegetable garden on a balcony", "cut down on screen time in the evening"],
}
CONCEPT = ["What is {}?", "Can you explain {} in simple terms?", "Explain {} like I'm ten.",
           "In two or three sentences, what is {}?", "I keep hearing about {}. What is it, exactly?"]
CONCEPT_POOL = {
    "train": ["compound interest", "photosynthesis", "inflation", "a black hole", "machine learning",
              "the greenhouse effect", "a credit score", "DNA", "an API", "supply and demand", "the immune system",
              "a recession", "cloud computing", "gravity", "a vaccine", "the stock market", "a password manager",
              "the water cycle", "regenerative braking", "a budget deficit", "encryption", "a placebo",
              "the Roman Empire", "a solar eclipse", "plate tectonics"],
    "eval": ["a blockchain", "the Doppler effect", "a food chain"],
}
WHY = ["{}", "{} Keep it short, please.", "Quick question: {}", "My kid just asked me this and I had no idea: {}",
       "{} Explain it simply."]
WHY_POOL = {
    "train": ["Why is the sky blue?", "Why do onions make people cry?", "Why do we get hiccups?",
              "Why does bread go stale?", "Why do cats purr?", "Why is the ocean salty?",
              "Why do leaves change colour in autumn?", "Why do we yawn?", "Why does ice float on water?",
              "Why do airplanes leave white trails in the sky?", "Why do we have leap years?",
              "Why does my phone battery drain faster in the cold?", "Why do people get jet lag?",
              "Why is it hotter in summer than in winter?", "Why do metal spoons feel colder than wooden ones?",
              "Why does coffee keep people awake?", "Why do some people need glasses?", "Why do stars twinkle?",
              "Why do soap bubbles pop?", "Why do our fingers wrinkle in the bath?", "Why do birds migrate?",
              "Why does the moon change shape?", "Why do we dream?", "Why is exercise good for the brain?",
              "Why do car tyres lose air over time?"],
    "eval": ["Why do rainbows form after rain?", "Why do dogs wag their tails?", "Why does popcorn pop?"],
}
COMPARE = ["What's the difference between {} and {}?", "How is {} different from {}?",
           "Can you explain the difference between {} and {} in a few sentences?",
           "People often mix up {} and {}. How do they differ?",
           "I never know the difference between {} and {}. Can you help?"]
COMPARE_POOL = {
    "train": [("a virus", "a bacterium"), ("weather", "climate"), ("a debit card", "a credit card"),
              ("baking soda", "baking powder"), ("a crocodile", "an alligator"), ("RAM", "storage"),
              ("a latte", "a cappuccino"), ("renting", "buying a home"), ("a lake", "a pond"),
              ("speed", "velocity"), ("an ebook", "a paper book"), ("a simile", "a metaphor"),
              ("a hurricane", "a tornado"), ("a Python list", "a tuple"), ("a psychologist", "a psychiatrist"),
              ("'affect'", "'effect'"), ("a moth", "a butterfly"), ("a laptop", "a tablet"), ("jam", "jelly"),
              ("an LED bulb", "an incandescent bulb"), ("a frog", "a toad"), ("weightlifting", "cardio"),
              ("a comet", "an asteroid"), ("HTTP", "HTTPS"), ("a mortgage", "a personal loan")],
    "eval": [("a cold", "the flu"), ("a violin", "a viola"), ("a hill", "a mountain")],
}
ADVICE_POOL = {
    "train": [
        "I have my first job interview tomorrow and I'm really nervous. Any advice?",
        "My roommate keeps leaving dishes in the sink. How can I bring it up without starting a fight?",
        "I keep hitting snooze every morning. How can I actually get up on time?",
        "My friend's birthday is this weekend and I have no gift ideas. She likes hiking and tea. What could I get her?",
        "I just moved to a new town and don't know anyone. How can I meet people?",
        "I want to ask my manager for a raise. How should I prepare?",
        "My teenager barely talks to me anymore. How can I reconnect?",
        "I have three exams next week and feel overwhelmed. How should I plan my studying?",
        "I get anxious before speaking up in meetings. What can help?",
        "I'm hosting dinner for six people on a tight budget. What could I cook?",
        "My neighbour's dog barks all night. What's a polite way to deal with it?",
        "I want to start exercising but only have twenty minutes a day. What should I do?",
        "I spend too much money on takeout. How can I cut back?",
        "A coworker keeps taking credit for my ideas. How should I handle it?",
        "I'm going on a week-long trip and always overpack. Any packing tips?",
        "I said something hurtful to a friend and want to apologise. How should I do it?",
        "I'm trying to choose between two job offers. What should I consider?",
        "My kids fight over screen time every evening. How can we make a fair rule?",
        "I feel tired every afternoon at work. What could I change?",
        "I want to read more books this year but never find the time. Any suggestions?",
        "I'm giving a toast at my brother's wedding. How do I make it good but short?",
        "My plants keep dying even though I water them. What might I be doing wrong?",
        "I need to tell my team we will miss a deadline. How should I phrase it?",
        "I'm learning to drive and get nervous on busy roads. Any tips?",
        "I want to volunteer but don't know where to start. What are some options?",
    ],
    "eval": [
        "My elderly father refuses to use his new smartphone. How can I help him get comfortable with it?",
        "I've been invited to a potluck and can't cook. What could I bring?",
        "I'm starting a night shift job next month. How can I adjust my sleep?",
    ],
}
CREATIVE_POOL = {
    "train": [
        "Write a short poem about a rainy Monday.", "Suggest five names for a small coffee shop by the sea.",
        "Give me three ideas for a fun family weekend at home.", "Write a two-sentence horror story.",
        "Suggest a few board games for four adults who like strategy.", "Write a haiku about autumn leaves.",
        "Come up with a catchy slogan for a bike repair shop.",
        "Give me a simple weekly meal plan for someone who doesn't eat meat.",
        "Write a short thank-you note to a teacher.", "Suggest some icebreaker questions for a team meeting.",
        "Write a limerick about a forgetful cat.", "What are some good names for a golden retriever puppy?",
        "Give me ideas for a ten-minute science experiment with kids.",
        "Write a short motivational message for someone starting a new job.",
        "Suggest a theme for a birthday party for a seven-year-old.",
        "Write a one-paragraph description of a cosy mountain cabin.",
        "Give me a few conversation starters for a first date.", "Write a riddle whose answer is 'a shadow'.",
        "Suggest some healthy snacks I can take to work.",
        "Write a short product description for a reusable water bottle.", "Give me five fun facts about octopuses.",
        "Write a friendly out-of-office email reply.",
        "Suggest a short stretching routine for after sitting all day.",
        "Write a four-line poem about the first snow of winter.",
        "Give me three ideas for a date night that costs almost nothing.",
    ],
    "eval": ["Write a short poem about a lighthouse keeper.", "Suggest names for a bakery that only sells pies."],
}
CHAT = [(HOW_TO, HOW_TO_POOL), (CONCEPT, CONCEPT_POOL), (WHY, WHY_POOL), (COMPARE, COMPARE_POOL),
        (["{}"], ADVICE_POOL), (["{}"], CREATIVE_POOL)]

# ---------------------------------------------------------------------------------------------
# summarize: paragraphs of 60-120 words, each given whole in the prompt.

SUMMARIZE_ASKS = [
    "Summarize this paragraph in one sentence:\n\n{}",
    "Can you give me the main point of this in a couple of sentences?\n\n{}",
    "TL;DR please:\n\n{}",
    "Summarize the following in three short bullet points.\n\n{}",
    "{}\n\nSum that up in under 30 words.",
    "Write a one-line summary of this text for a newsletter:\n\n{}",
    "Here is a paragraph from an article:\n\n{}\n\nWhat is it saying, briefly?",
    "Explain the key idea of this passage to a busy reader in two sentences.\n\n{}",
]
PARAGRAPHS = {
    "train": [
        "Honeybees tell each other where to find flowers through a movement known as the waggle dance. When a "
        "forager returns to the hive, it walks in a figure-eight pattern while shaking its body. The angle of the "
        "straight part of the dance, relative to the vertical, tells other bees the direction of the food compared "
        "with the sun. The length of the waggle shows how far away the flowers are. Scientists decoded this "
        "behaviour in the 1940s, and it remains one of the most complex forms of communication known in insects.",
        "Starting next month, the office will move to a hybrid schedule. Employees are expected to be on site on "
        "Tuesdays and Thursdays and may work from home on the other days. Team leads can ask for extra office days "
        "for workshops or client visits, but must give at least one week of notice. Desks will no longer be "
        "assigned; instead, staff can book a desk through the new reservation app. Please make sure your laptop has "
        "the latest security update before the change, as the IT team will be checking devices at the entrance.",
        "The town library reopened on Saturday after an eight-month renovation. The building now has a larger "
        "children's section, a quiet study room with twenty desks, and a small recording studio that anyone with a "
        "library card can book for free. Solar panels on the roof are expected to cover about a third of the "
        "building's electricity. The head librarian said visitor numbers had been falling for years, and she hopes "
        "the new spaces will bring back teenagers and young families. Opening hours have also been extended to nine "
        "in the evening on weekdays.",
        "Most adults need between seven and nine hours of sleep a night, yet surveys suggest that a third regularly "
        "get less. Short sleep does more than make people tired. It weakens the immune system, makes it harder to "
        "concentrate, and is linked to a higher risk of heart disease and weight gain. Experts recommend keeping a "
        "regular bedtime, avoiding caffeine after lunch, and putting screens away an hour before bed. A cool, dark "
        "bedroom also helps. Small changes like these often improve sleep within a couple of weeks.",
        "Before the printing press, books in Europe were copied by hand, usually by monks, and a single volume could "
        "take months to finish. Around 1440, Johannes Gutenberg developed a press with movable metal type that could "
        "produce pages far more quickly. Within fifty years, printers were working in more than two hundred European "
        "cities, and millions of books were in circulation. Cheaper books helped spread literacy, new scientific "
        "ideas and religious debates, and many historians see the press as one of the inventions that shaped the "
        "modern world.",
        "I bought this blender three months ago, mainly for morning smoothies. It crushes ice and frozen fruit "
        "easily, and the jug is light enough to hold with one hand. Cleaning is simple: add warm water and a drop of "
        "soap, run it for thirty seconds, and rinse. My only complaint is the noise, which is loud enough to wake "
        "the rest of the house if I use it early. The lid also fits a little tightly. Overall it is good value for "
        "the price, and I would buy it again.",
        "Octopuses are among the most intelligent invertebrates. They can solve simple puzzles, open jars to reach "
        "food, and find their way through mazes. Each of their eight arms contains clusters of nerve cells, so an "
        "arm can react to touch and taste without waiting for instructions from the brain. Octopuses can also change "
        "the colour and texture of their skin in a fraction of a second, which helps them hide from predators and "
        "sneak up on prey. Most species live only one or two years, which makes their learning abilities even more "
        "surprising.",
        "The city's bike-share programme recorded its busiest year yet, with more than two million trips. Officials "
        "credit new protected bike lanes along the main avenues and the addition of electric bikes, which now make "
        "up almost half of the fleet. The average trip lasted fourteen minutes, and most rides started near train "
        "stations, suggesting that many people use the bikes for the last part of their commute. The programme "
        "plans to add sixty stations next year, mostly in neighbourhoods on the edge of the city that have had few "
        "options so far.",
        "Dear parents, our class trip to the science museum is planned for Friday the 12th. The bus will leave "
        "school at 8:45 and return by 3:00. Children should bring a packed lunch, a water bottle and a raincoat, as "
        "part of the visit takes place in the outdoor garden. The museum is free for school groups, but we ask for a "
        "contribution of five dollars to cover transport. Please return the signed permission slip by Wednesday. If "
        "your child has any allergies, let me know so I can inform the museum staff.",
        "Coffee is believed to have been first used in Ethiopia, where, according to legend, a goat herder noticed "
        "that his animals became lively after eating the red berries of a certain shrub. By the fifteenth century, "
        "coffee was being grown in Yemen and drunk in Sufi monasteries to help people stay awake during night "
        "prayers. Coffee houses soon spread across the Middle East and later to Europe, where they became places for "
        "conversation, business and news. Today coffee is one of the most traded agricultural products in the world.",
        "Iceland sits on the Mid-Atlantic Ridge, where the North American and Eurasian plates are slowly pulling "
        "apart. This is why the island has so many volcanoes and hot springs. Icelanders have learned to use that "
        "heat: geothermal energy warms about nine out of ten homes and supplies a large share of the country's "
        "electricity. Greenhouses heated by hot water allow farmers to grow tomatoes and even bananas in a cold "
        "climate. The same forces also bring risks, as eruptions can disrupt air travel and threaten nearby towns.",
        "Every morning, the old man at the corner bakery left one loaf of bread on the bench outside before opening. "
        "Nobody knew who it was for. Some neighbours thought it was for the birds; others guessed it was a habit "
        "from years ago. One winter morning, a young girl finally asked him. He smiled and said that when he was a "
        "boy, someone had left bread for him on that same bench, during a year when his family had nothing. He had "
        "never learned who it was, so he simply kept the bench full.",
        "Researchers have found that even a short walk can improve mood. In one study, volunteers who walked briskly "
        "for ten minutes reported feeling more energetic and less tense than those who sat and read a magazine. "
        "Exercise raises levels of chemicals in the brain that affect mood and attention, and regular activity is "
        "linked to lower rates of depression. The effect does not require a gym or special equipment. Climbing "
        "stairs, cycling to work or dancing in the kitchen all count, and the benefits appear to build up over time.",
        "Version 3.2 of the app introduces an offline mode, so users can read saved articles without an internet "
        "connection. Saved items now sync across devices within a few seconds instead of several minutes. We have "
        "also redesigned the settings page to make privacy options easier to find, and added a dark theme that "
        "follows the phone's system setting. Several bugs have been fixed, including one that caused the app to "
        "crash when opening very long articles. Support for phones more than five years old will end with this "
        "release.",
        "Recycling only works when materials are sorted correctly. A single greasy pizza box or a plastic bag in the "
        "paper bin can spoil an entire batch, which then ends up in a landfill. Many people also put items in the "
        "recycling bin that cannot be processed locally, hoping they will be recycled anyway. Waste managers call "
        "this wishcycling. To help, the city has published a simple guide: rinse containers, keep bags out of the "
        "bin, and check the website when in doubt. Clean, well-sorted materials sell for more and keep the "
        "programme affordable.",
        "The Great Wall of China is not a single wall but a series of fortifications built over roughly two "
        "thousand years. Early sections were made of rammed earth, while the best-known parts, built during the "
        "Ming dynasty, used brick and stone. The wall was meant to protect against raids from the north and to "
        "control trade along the border. Its total length, including branches, is estimated at more than twenty "
        "thousand kilometres. Contrary to a popular myth, it cannot be seen with the naked eye from space.",
        "Learning a new language as an adult is slower than it is for young children, but adults have some "
        "advantages. They can use grammar explanations, make study plans and connect new words to things they "
        "already know. Research suggests that short daily practice beats long weekly sessions, because the brain "
        "remembers better when learning is spread out. Speaking early, even with mistakes, also helps. Many learners "
        "find that listening to podcasts or watching shows with subtitles makes the language feel more natural and "
        "keeps them motivated.",
        "A group of residents has turned an empty lot behind the post office into a community garden. Over the "
        "spring, volunteers cleared rubbish, built twelve raised beds and installed a rain barrel to collect water "
        "from the neighbouring roof. Each bed is shared by two households, and one is reserved for the nearby "
        "primary school. The group meets on Sunday mornings to plan work and share tools. They say the garden has "
        "done more than produce vegetables: neighbours who had never spoken now know each other by name.",
        "Antibiotics are medicines that kill bacteria or stop them from multiplying. They do not work against "
        "viruses, so they cannot cure a cold or the flu. When antibiotics are used too often or not taken as "
        "prescribed, some bacteria survive and become resistant, meaning the drugs no longer work against them. "
        "Resistant infections are harder to treat and can be dangerous. Doctors therefore advise patients to take "
        "the full course when antibiotics are needed and never to use leftover pills or share them with others.",
        "I am writing about my order from last week. I paid for express delivery, but the package arrived four days "
        "late, and one of the two mugs inside was broken. I contacted customer service by chat on Monday and was "
        "told someone would reply within 24 hours, but I have heard nothing since. I would like a replacement for "
        "the broken mug and a refund of the express delivery charge. I have attached photos of the damaged item and "
        "the packaging. I hope we can resolve this quickly, as I have ordered from you many times before.",
        "Tides are caused mainly by the pull of the moon's gravity on the Earth's oceans. The moon pulls the water "
        "on the side of the Earth facing it, creating a bulge, and a second bulge forms on the opposite side. As the "
        "Earth rotates, most coastlines pass through both bulges each day, which is why they see two high tides and "
        "two low tides roughly every day. The sun also has an effect. When the sun and moon line up, the tides are "
        "stronger; when they are at right angles, the tides are weaker.",
        "A company that makes accounting software tried a four-day working week for six months. Staff kept their "
        "full salaries but worked thirty-two hours instead of forty. Managers cut down on meetings and asked teams "
        "to agree on clear weekly goals. At the end of the trial, the company reported that productivity had stayed "
        "the same, while sick days dropped by a third and fewer employees left. Some customer support staff found "
        "the change harder because calls still came in on Fridays, so the company now staggers their days off.",
        "The marathon is named after a legend from ancient Greece. According to the story, a messenger ran from the "
        "battlefield at Marathon to Athens to announce a victory, then collapsed and died. When the modern Olympic "
        "Games began in 1896, organisers added a long-distance race to honour the tale. The distance was not fixed "
        "at first. The now-standard 42.195 kilometres comes from the 1908 London Olympics, where the route was "
        "stretched so that the race could start at Windsor Castle and finish in front of the royal box.",
        "Light pollution is making the night sky disappear for most people. In many cities, only a handful of stars "
        "are visible, and some children have never seen the Milky Way. Artificial light at night also confuses "
        "migrating birds, disturbs insects and can affect human sleep. Some towns have responded by switching to "
        "shielded street lamps that point downward and by dimming lights late at night. A few places have been "
        "named dark-sky reserves, where strict lighting rules protect the view of the stars and attract visitors.",
        "We are looking for a part-time assistant to join our small veterinary clinic. The role involves greeting "
        "clients, answering the phone, booking appointments and helping the vets with basic tasks such as holding "
        "animals during check-ups. No medical training is needed, but you should be comfortable around cats and "
        "dogs and able to stay calm in busy moments. The position is twenty hours a week, including one Saturday a "
        "month. If you are interested, send a short note about yourself and your availability to the clinic.",
        "Sharks have existed for more than four hundred million years, longer than trees. There are over five "
        "hundred species, ranging from the dwarf lanternshark, which fits in a hand, to the whale shark, the largest "
        "fish in the sea. Despite their fearsome reputation, most sharks pose no threat to humans, and attacks are "
        "rare. Sharks are far more at risk from people: millions are caught each year, often for their fins. "
        "Because they are top predators, their decline can upset entire ocean ecosystems.",
        "Many home cooks struggle to get crispy roasted vegetables. The most common mistake is crowding the tray. "
        "When vegetables are packed too closely, they release steam and end up soft instead of browned. Use two "
        "trays if necessary, and spread the pieces out in a single layer. Cutting everything to a similar size helps "
        "it cook evenly. A hot oven, around 220 degrees Celsius, and a light coating of oil make a big difference "
        "too. Finally, resist the urge to stir too often; turning them once halfway through is enough.",
        "The Voyager 1 spacecraft was launched in 1977 to study Jupiter and Saturn. After completing that mission, "
        "it kept travelling outward, and in 2012 it became the first human-made object to enter interstellar space. "
        "It is now more than twenty billion kilometres from Earth, and its radio signals take nearly a day to reach "
        "us. The spacecraft carries a golden record with sounds and images from Earth, in case it is ever found. "
        "Its power is slowly running out, and engineers have been switching off instruments to keep it going.",
        "Notes from Thursday's planning meeting: the team agreed to delay the website launch by two weeks because "
        "the payment page failed testing. Ravi will work with the bank's support team to fix the problem and report "
        "back on Monday. Meanwhile, Lena will finish the help pages and prepare a short video showing how to place "
        "an order. Marketing will hold the launch email until a new date is confirmed. The next meeting is on the "
        "14th, when the team will decide whether the launch can go ahead.",
        "Chess is thought to have started in India around the sixth century, in a game called chaturanga. It spread "
        "to Persia and then, through the Islamic world, to Europe, where the rules slowly changed. The queen, once a "
        "weak piece that moved one square diagonally, became the most powerful piece on the board in the fifteenth "
        "century, which made the game faster. In 1997, the computer Deep Blue beat world champion Garry Kasparov, "
        "and today chess programs running on a phone can defeat any human player.",
        "The idea that everyone must drink eight glasses of water a day is popular but not based on strong "
        "evidence. The amount of water a person needs depends on their size, activity level and the climate they "
        "live in. Much of our water also comes from food, such as fruit, vegetables and soup, and from other "
        "drinks, including tea and coffee. For most healthy people, thirst is a reliable guide. Pale yellow urine is "
        "a good sign of being well hydrated, while dark urine may mean it is time to drink more.",
        "This year's harvest festival drew a record crowd of about fifteen thousand people over the weekend. Local "
        "farms sold apples, honey and pumpkins, while food stalls offered everything from dumplings to pies. The "
        "highlight for many was the giant pumpkin contest, won by a 480-kilogram entry grown by a retired "
        "schoolteacher. Organisers had added free shuttle buses from the train station to reduce traffic, and they "
        "say the change worked well. Some visitors complained about long queues for the toilets, which the "
        "committee promised to fix next year.",
        "Security experts now recommend long passphrases over short, complicated passwords. A phrase made of four "
        "or five random words is easier to remember and much harder for computers to guess than a short string of "
        "symbols. Reusing the same password on many websites is the bigger danger, because one leak can expose all "
        "of your accounts. A password manager can create and store a different strong password for every site. "
        "Turning on two-factor authentication adds another layer of protection, so a stolen password alone is not "
        "enough to break in.",
        "Emperor penguins breed during the Antarctic winter, when temperatures can fall below minus forty degrees. "
        "After the female lays a single egg, she passes it to the male and heads to the sea to feed. The male keeps "
        "the egg warm on his feet, under a fold of skin, for about two months without eating. Thousands of males "
        "huddle together and take turns standing on the colder outside of the group. When the chick hatches, the "
        "female returns with food, and the exhausted male finally walks back to the ocean.",
        "Dear residents, the water supply to the building will be switched off on Tuesday from 9 a.m. to about 2 "
        "p.m. while plumbers replace the main valve in the basement. Please store some water beforehand for "
        "drinking and cooking, and avoid using washing machines or dishwashers on Tuesday morning. The lift will "
        "keep working as normal. If the work takes longer than expected, we will post an update on the notice board "
        "by the front door. We apologise for the inconvenience and thank you for your patience.",
        "Origami, the Japanese art of paper folding, has found surprising uses in engineering. Designers have used "
        "folding patterns to pack large solar panels into small rockets, which then unfold once in space. Medical "
        "researchers are working on tiny folded devices that could travel through blood vessels and open up where "
        "they are needed. The same ideas appear in everyday objects, such as maps that open with one pull and car "
        "airbags that must unfold in a precise way. Mathematicians study these patterns to work out which shapes "
        "can be folded.",
        "Electric cars are becoming more common as battery prices fall and charging networks grow. They are cheaper "
        "to run than petrol cars, because electricity usually costs less than fuel and there are fewer moving parts "
        "to maintain. However, they still cost more to buy in many countries, and drivers who cannot charge at home "
        "may find them less convenient. Range has improved a lot, and many new models can travel more than four "
        "hundred kilometres on a single charge. Cold weather can reduce that range noticeably.",
        "The Library of Alexandria, in ancient Egypt, was one of the largest libraries of the ancient world. "
        "Founded in the third century BC, it aimed to collect copies of every known book. Ships arriving in the "
        "city were reportedly searched for scrolls, which were copied before the originals were returned, or "
        "sometimes kept. Scholars there made advances in mathematics, astronomy and medicine. The library did not "
        "disappear in a single fire, as is often said; it declined over several centuries through lack of funding, "
        "political unrest and war.",
        "Students at Riverside High will now need twenty hours of community service to graduate. The school board "
        "approved the change last week after a year of discussion. Students can volunteer at food banks, animal "
        "shelters, libraries or local sports clubs, and the hours can be spread over all four years. Supporters say "
        "the requirement teaches responsibility and helps students explore possible careers. Some parents worry "
        "that students with jobs or family duties will struggle to find the time, so the school will also accept "
        "certain kinds of help at home.",
        "Microplastics are pieces of plastic smaller than five millimetres. Some are made small on purpose, like the "
        "beads once used in face scrubs, but most come from larger items breaking down, such as bottles, bags and "
        "synthetic clothing. They have been found in the deep ocean, in Arctic snow and in drinking water. "
        "Scientists are still studying what they do to human health. Washing clothes at lower temperatures, using "
        "filters on washing machines and cutting back on single-use plastic are some ways to reduce how many end up "
        "in the environment.",
        "A fox saw a bunch of ripe grapes hanging from a high vine. He jumped to reach them but missed. He stepped "
        "back, took a running start and jumped again, but still could not reach. After several more tries, he gave "
        "up and walked away with his nose in the air, saying that the grapes were probably sour anyway. The story, "
        "one of Aesop's fables, gave us the phrase sour grapes, which describes pretending not to want something "
        "only because you cannot have it.",
        "Noise-cancelling headphones use tiny microphones to listen to the sound around you. A chip then creates a "
        "sound wave that is the exact opposite of the incoming noise, and when the two waves meet, they largely "
        "cancel each other out. This works best for steady, low sounds like the hum of an airplane engine or an air "
        "conditioner. Sudden or high-pitched noises, such as voices or a dog barking, are harder to remove. That is "
        "why many headphones also rely on a snug fit and padding to block sound physically.",
        "The sandwich is often said to be named after John Montagu, the fourth Earl of Sandwich, an "
        "eighteenth-century English nobleman. According to the story, he asked for meat between two slices of bread "
        "so he could eat without leaving the card table. Historians point out that people had been putting food "
        "between bread long before him, but his name made the idea fashionable in London. Today the sandwich is one "
        "of the most common lunches in the world, with local versions from the Vietnamese banh mi to the Cuban "
        "sandwich.",
        "Lower back pain is one of the most common reasons people visit a doctor, and most cases get better on their "
        "own within a few weeks. Staying gently active usually helps more than resting in bed. Walking, light "
        "stretching and keeping up normal daily tasks, as far as the pain allows, can speed recovery. Heat packs and "
        "over-the-counter painkillers may ease discomfort. People should see a doctor quickly if the pain follows a "
        "fall, comes with fever or numbness, or keeps getting worse instead of better.",
        "Planting trees is often promoted as a simple way to fight climate change, but experts say it is not quite "
        "that simple. Young trees absorb little carbon in their first years and need care to survive. Planting the "
        "wrong species, or planting on natural grasslands, can harm local wildlife and water supplies. Protecting "
        "existing forests usually stores more carbon, more quickly, than planting new ones. Tree planting works "
        "best as part of a wider plan that includes cutting emissions and involving local communities who will look "
        "after the trees.",
        "The city museum's new exhibition explores two hundred years of everyday clothing. Rather than focusing on "
        "famous designers, it shows what ordinary people wore to work, to school and to celebrations. Visitors can "
        "see a nineteenth-century fisherman's wool sweater, wartime dresses made from recycled fabric and the first "
        "jeans sold in local shops. A hands-on area lets children try on copies of old hats and coats. The "
        "exhibition runs until March, and entry is free on the first Sunday of each month.",
        "Bamboo is one of the fastest-growing plants on Earth. Some species can grow almost a metre in a single day "
        "under good conditions. Although it looks like a tree, bamboo is actually a type of grass. It is strong, "
        "light and flexible, which is why it has been used for centuries to build houses, bridges and scaffolding in "
        "parts of Asia. Because it grows back quickly after being cut, bamboo is often promoted as an eco-friendly "
        "material, though its benefits depend on how it is farmed and processed.",
        "Many people check their phones more than a hundred times a day, often without noticing. Each notification "
        "pulls attention away from the task at hand, and it can take several minutes to get fully focused again. "
        "Some simple habits can help. Turning off non-essential notifications, keeping the phone in another room "
        "while working and setting specific times to check messages all reduce interruptions. Some people also "
        "switch their screen to greyscale, which makes apps less eye-catching. The aim is not to give up phones but "
        "to use them on purpose.",
        "The regional transport authority will give drivers a discount on motorway tolls if they travel with at "
        "least two passengers. The scheme, starting in June, aims to reduce traffic jams during rush hour and cut "
        "air pollution. Drivers will register their car online, and cameras at toll gates will count the people "
        "inside. Some critics have raised privacy concerns about the cameras, but the authority says the images "
        "will be deleted within a day. A similar programme in another region reduced peak-hour traffic by about "
        "eight percent.",
    ],
    "eval": [
        "Tardigrades, also called water bears, are tiny animals less than a millimetre long that live in moss, soil "
        "and water almost everywhere on Earth. They are famous for surviving extreme conditions. When their "
        "surroundings dry out, they curl into a state called a tun, losing almost all the water in their bodies and "
        "nearly stopping their metabolism. In this state, they can survive freezing, intense heat, high radiation "
        "and even a trip into space. When water returns, they can revive within hours and carry on as if nothing "
        "had happened.",
        "From the first of next month, all expense claims must be submitted through the new online portal rather "
        "than by email. Receipts should be photographed and attached to each claim, and claims must be filed within "
        "thirty days of the purchase. Managers will receive an automatic notification when a claim needs their "
        "approval and should respond within five working days. Paper forms will still be accepted for one more "
        "month while everyone gets used to the system. A short training session will be held in the main meeting "
        "room on Wednesday afternoon.",
        "In the year 79, Mount Vesuvius erupted and buried the Roman town of Pompeii under several metres of ash and "
        "pumice. The disaster killed many of its residents, but it also preserved the town in remarkable detail. "
        "When excavations began in the eighteenth century, archaeologists found streets, shops, bakeries with loaves "
        "still in the ovens, and walls covered in paintings and graffiti. Plaster casts made from hollows in the ash "
        "show people in their final moments. Pompeii offers one of the clearest pictures of everyday life in the "
        "Roman world.",
        "We stayed at the hotel for three nights during a family holiday. The room was spotless and larger than "
        "expected, with a small balcony overlooking the harbour. Breakfast had plenty of choice, although the coffee "
        "was weak and the eggs were often cold by mid-morning. Staff at the front desk were friendly and helped us "
        "book a boat trip at short notice. The main drawback was noise from the bar downstairs, which stayed open "
        "until one in the morning. We would return, but would ask for a room on a higher floor.",
        "Fermentation is one of the oldest ways of preserving food. In the process, bacteria or yeasts break down "
        "sugars and produce acids, gases or alcohol. These changes stop harmful microbes from growing and give "
        "fermented foods their sour or tangy taste. Yogurt, sauerkraut, kimchi, soy sauce and sourdough bread all "
        "depend on fermentation. Some fermented foods contain live bacteria that may support a healthy gut, though "
        "scientists are still studying how strong that effect is. People have been fermenting food for thousands of "
        "years, long before anyone knew microbes existed.",
        "The town council voted on Monday to keep the public swimming pool open for another five years. The pool, "
        "built in the 1970s, needs a new roof and heating system, and the repairs are expected to cost about two "
        "million dollars. Some council members had proposed closing it and building a smaller splash park instead, "
        "but more than three thousand residents signed a petition to save it. Swimming clubs and schools argued that "
        "the pool is the only place in the area where children can take lessons. Work will begin in the autumn.",
        "Each autumn, millions of monarch butterflies travel from Canada and the United States to the mountains of "
        "central Mexico, a journey of up to four thousand kilometres. No single butterfly makes the round trip. The "
        "monarchs that fly south live for several months, much longer than the summer generations, and spend the "
        "winter clustered on fir trees. In spring they begin the trip north, but it takes three or four generations "
        "to reach Canada again. Scientists believe the butterflies use the position of the sun and the Earth's "
        "magnetic field to navigate.",
        "Dear members, from the start of next month the fitness centre will open at 5:30 a.m. instead of 6:00 on "
        "weekdays, following many requests from early risers. To balance the cost, the centre will close one hour "
        "earlier on Sundays. We are also replacing the old rowing machines with six new ones and adding a "
        "stretching area next to the studio. Group classes can now be booked up to a week ahead through the app. "
        "Membership prices will stay the same until the end of the year. Thank you for training with us.",
        "The first bicycles, built in Germany in the early 1800s, had no pedals. Riders sat on a wooden frame and "
        "pushed themselves along with their feet. Pedals were added to the front wheel in the 1860s, which led to "
        "the penny-farthing, with its huge front wheel and tiny back one. It was fast but dangerous to ride. The "
        "so-called safety bicycle of the 1880s, with two equal wheels and a chain driving the back wheel, looks much "
        "like bikes today and made cycling popular with millions of people.",
        "Coral reefs cover less than one percent of the ocean floor but are home to about a quarter of all marine "
        "species. Corals are animals that live in partnership with tiny algae, which give them food and their "
        "bright colours. When the water becomes too warm, corals push out the algae and turn white, a process called "
        "bleaching. If temperatures return to normal quickly, they can recover, but repeated heatwaves are killing "
        "large areas of reef. Reefs also protect coasts from storms and support fishing and tourism for millions of "
        "people.",
        "On the last day of summer camp, the children buried a tin box under the old oak by the lake. Inside they "
        "put drawings, a few coins, a friendship bracelet and a letter to their future selves. They promised to come "
        "back in ten years to open it. Most of them forgot. But a decade later, one of them, now a nurse in a "
        "distant city, found a photo of the oak tree in a drawer. She took a week off, drove back to the lake and "
        "found three others already waiting there.",
        "Sitting at a desk for hours can lead to neck, shoulder and back pain, but a few adjustments can help. The "
        "top of the screen should be at or slightly below eye level, about an arm's length away. Feet should rest "
        "flat on the floor or a footrest, with knees roughly level with the hips. Keep the keyboard close so that "
        "the elbows stay near the body. Most importantly, get up and move every half hour or so, because no chair "
        "position is comfortable for very long.",
        "Salt has shaped human history in surprising ways. Before refrigeration, it was one of the only ways to "
        "preserve meat and fish, so it was highly valuable. Roman soldiers were sometimes given an allowance to buy "
        "salt, and some historians link this to the word salary, though the connection is debated. Taxes on salt "
        "have sparked protests, including Gandhi's famous Salt March in 1930 against British rule in India. Today "
        "salt is cheap and everywhere, and the main concern is that many people eat too much of it.",
        "Phone scams are becoming more convincing. Callers may pretend to be from a bank, a delivery company or even "
        "the police, and some use software to make the caller ID look genuine. A common trick is to create a sense "
        "of urgency, claiming an account has been hacked or a fine must be paid immediately. Real organisations "
        "rarely ask for passwords or payment over the phone. If in doubt, hang up and call back using the number on "
        "the company's official website. Reporting scam numbers helps protect others.",
        "Crows are among the cleverest birds. In experiments, they have used sticks to fish food out of narrow tubes "
        "and even bent wire into hooks. Studies in cities have shown that crows can recognise individual human faces "
        "and remember people who treated them badly, scolding them years later. They also seem to pass this "
        "knowledge on to other crows. Some crows drop nuts onto roads so that passing cars crack them open, then "
        "wait for the traffic light to turn red before collecting the pieces.",
        "A new café in the old train station is trying an unusual idea: customers pay for the time they spend "
        "there, not for what they eat or drink. Coffee, tea and snacks are free, and the price is ten cents a "
        "minute, up to a daily maximum. The owners say the model suits students and remote workers who stay for "
        "hours with a single drink. The café has fast internet, quiet corners and a long shared table. So far it has "
        "been busy on weekdays, though weekend visitors seem less sure about the idea.",
    ],
}

# ---------------------------------------------------------------------------------------------
# rewrite: each kind is (phrasings, pool of texts to rewrite); each instruction is laid out twice,
# before the text in quotes and above it.


def layouts(instructions: list[str]) -> list[str]:
    return [f'{ask} "{{}}"' for ask in instructions] + [f"{ask}\n\n{{}}" for ask in instructions]


FORMAL = ["Rewrite this to sound more formal:", "Make this sound professional, for an email to a client:",
          "Can you make this message more formal?", "Rewrite this in a polite, formal tone:"]
FORMAL_POOL = {
    "train": [
        "hey, can't make it to the meeting tmrw, something came up. can we move it?",
        "thanks a ton for the help yesterday, you're a lifesaver!",
        "the report's gonna be late, sorry, still waiting on numbers from finance.",
        "just checking if you got my last email about the invoice?",
        "we need the files asap or the whole thing's gonna fall apart.",
        "can u send me the slides from today? i missed the first half.",
        "no worries about the delay, stuff happens.",
        "heads up: the printer on floor 2 is busted again.",
        "I think your idea is kinda great but we need more details before we say yes.",
        "sorry I forgot to call you back, it's been a crazy week.",
        "the new guy starts monday, pls be nice and show him around.",
        "we're out of coffee again. who's buying?",
        "can we push the deadline to friday? the team's totally swamped.",
        "Got your package, everything looks good, thanks!",
        "I'm not gonna be able to join the call, just fill me in after.",
        "the client loved the demo, great job everyone!!",
        "so the budget got cut and we can't hire anyone till next year.",
        "let me know if the time works, otherwise we'll figure something out.",
        "quick q: is the parking lot open on saturday?",
        "your order's been shipped and should be there in like 3 days.",
        "hey, I owe you one for covering my shift last night.",
        "the meeting ran super long so I didn't get to your question, sorry.",
        "pls fill out the survey by thurs, it only takes 5 min.",
        "we messed up the dates on the flyer, new ones are coming.",
        "can you take a look at this when you get a sec?",
    ],
    "eval": [
        "yo, the shipment's stuck at customs, no idea when it'll get here.",
        "can't find the contract u sent, mind sending it again?",
        "we totally nailed the quarterly targets, drinks on me!",
    ],
}
SIMPLER = ["Rewrite this sentence in simpler words:", "Can you make this easier to understand?",
           "Say this in plain English:", "Rewrite this so a ten-year-old could understand it:"]
SIMPLER_POOL = {
    "train": [
        "The committee has reached the determination that the proposal, in its present form, is not viable.",
        "Owing to unforeseen circumstances, the event has been postponed until further notice.",
        "Individuals experiencing persistent symptoms are advised to seek medical consultation without delay.",
        "The utilisation of renewable energy sources can substantially diminish carbon emissions.",
        "Participants are required to furnish proof of identity prior to admission.",
        "The municipality intends to implement measures aimed at ameliorating traffic congestion.",
        "Precipitation is anticipated to commence in the late afternoon and persist throughout the evening.",
        "The applicant's qualifications were deemed insufficient for the position in question.",
        "Consumption of food and beverages is strictly prohibited within the confines of the laboratory.",
        "The company endeavours to optimise customer satisfaction through continuous improvement initiatives.",
        "In the event of a fire alarm, occupants must evacuate the premises via the nearest exit.",
        "The medication should be administered twice daily subsequent to meals.",
        "Photosynthesis is the process by which green plants convert light energy into chemical energy.",
        "The defendant's testimony was inconsistent with the evidence presented by the prosecution.",
        "Remuneration will be commensurate with experience and qualifications.",
        "The library requests that patrons refrain from engaging in loud conversation.",
        "Subsequent to the merger, several departments were consolidated to eliminate redundancy.",
        "A substantial proportion of respondents expressed dissatisfaction with the current arrangements.",
        "The vehicle's fuel efficiency is contingent upon driving conditions and maintenance.",
        "Students who fail to submit assignments by the stipulated deadline will incur a penalty.",
        "The exhibition endeavours to elucidate the cultural significance of traditional textiles.",
        "Insufficient hydration may precipitate headaches and diminished concentration.",
        "The tenant is obligated to notify the landlord of any necessary repairs in a timely manner.",
        "The software update rectifies several vulnerabilities that could compromise user data.",
        "Please be advised that the facility will be inaccessible during scheduled maintenance.",
    ],
    "eval": [
        "The organisation is committed to fostering an inclusive environment for all stakeholders.",
        "Excessive exposure to ultraviolet radiation can result in premature ageing of the skin.",
        "The bridge will remain closed pending the completion of a comprehensive structural assessment.",
    ],
}
SHORTER = ["Make this shorter without losing the meaning:", "Cut this down to one short sentence:",
           "Can you make this more concise?", "Trim this to under 15 words:"]
SHORTER_POOL = {
    "train": [
        "I am writing this email in order to let you know that I will not be able to attend the meeting that is "
        "scheduled for tomorrow afternoon.",
        "At this point in time, we are currently in the process of reviewing all of the applications that we have "
        "received.",
        "Due to the fact that it was raining very heavily, the football match was cancelled and will be played at a "
        "later date.",
        "It is my personal opinion that we should probably think about possibly changing the design of the logo.",
        "In the event that you have any questions or concerns whatsoever, please do not hesitate to get in touch "
        "with me.",
        "The reason why the project was delayed is because the materials that we ordered did not arrive on time.",
        "Each and every one of the members of the team worked really hard in order to finish the project before "
        "the deadline.",
        "We would like to take this opportunity to thank all of you for your continued support over the course of "
        "the past year.",
        "She made the decision to go back to school so that she could study to become a nurse.",
        "In my opinion, I think that the new park that they built downtown is a really nice place to spend time.",
        "There are a lot of people who believe that breakfast is the most important meal of the whole day.",
        "The new policy will be put into effect starting from the beginning of next month onwards.",
        "He was late to work this morning because of the fact that his car would not start.",
        "Our store will be closed for the entire duration of the holiday weekend, and we will open again on "
        "Tuesday.",
        "It goes without saying that safety should always be our number one top priority at all times.",
        "I just wanted to quickly reach out and follow up on the message that I sent to you last week.",
        "The results of the survey that we conducted show that most of the customers are happy with the service.",
        "You will need to make sure that you bring your passport with you when you go to the airport.",
        "With regard to the issue of parking, we are looking into various different options at the moment.",
        "The train that was supposed to arrive at ten o'clock was delayed by approximately twenty minutes.",
        "Despite the fact that the weather was cold, a large number of people came out to watch the parade.",
        "We are pleased to be able to announce that our new branch will be opening its doors in May.",
        "For the purpose of saving time, we have decided to hold the meeting online instead of in person.",
        "The book that I am reading at the moment is about the history of the city where I grew up.",
        "Please make sure to turn off all of the lights before you leave the office at the end of the day.",
    ],
    "eval": [
        "I wanted to let you know that I have finally finished reading the book that you lent to me a few months "
        "ago.",
        "Because there were so many people waiting in the queue, we decided to go and find a different place to "
        "eat.",
        "The meeting that we had planned to hold on Thursday has been moved so that it will now take place on "
        "Friday.",
    ],
}
GRAMMAR = ["Fix the grammar in this sentence:", "Can you correct the mistakes here?", "Please proofread this:",
           "Correct the spelling and grammar:"]
GRAMMAR_POOL = {
    "train": [
        "Me and him goes to the store every saturday.", "Their going to announce the winners tomorow.",
        "She don't like when people is late to meetings.", "I seen that movie last week and it were great.",
        "The list of items are on the desk, next to the printer.", "Between you and I, the plan have some problems.",
        "Its been a long time since we last speak.", "He runned all the way to the bus stop but it already leaved.",
        "Everyone need to bring they're own lunch on friday.", "Less people came to the event then we expected.",
        "I could of finished it yesterday if I had more time.", "The childrens was playing in the park all afternoon.",
        "We was told that the office will closed on monday.", "Who's book is this, and where did you found it?",
        "If I would have known, I would of called you.", "The data shows that sales has increased alot this year.",
        "My sister and me has been learning french since two years.",
        "There is many reasons why I prefer trains then planes.", "He didn't wanted to go, but he goes anyway.",
        "Your the best teacher I ever had, thank you so much.", "Each of the students have finished there homework.",
        "I am agree with you about the new schedule.", "The weather was so nice that we decide to eat outside.",
        "Can you borrow me your pen for a minute?", "She has went to the doctor three times this month.",
    ],
    "eval": ["Him and his brother was waiting outside since an hour.",
             "The teacher gived us to much homework this weekend.",
             "Neither of the answers are correct, but its close."],
}
POLITE = ["Make this message sound friendlier:", "Rewrite this so it is more polite:",
          "Can you soften the tone of this?", "Rephrase this kindly:"]
POLITE_POOL = {
    "train": [
        "Send me the report today. It's already late.", "Your presentation was too long and confusing.",
        "Stop parking in my spot.", "I need an answer by noon, no excuses.", "You forgot to attach the file again.",
        "Don't call me after 8 p.m.", "The food was cold and the service was slow.",
        "Fix the typos before you send it to the client.", "This isn't what I asked for. Do it again.",
        "I can't help you with that. Ask someone else.", "Turn your music down, it's way too loud.",
        "We're not interested in your offer.", "Clean up the kitchen after you use it.",
        "You're late. The meeting started ten minutes ago.", "Reply to my emails faster.",
        "Your code breaks the build. Revert it.", "I won't be coming to the party.",
        "The rent is due tomorrow. Pay it on time.", "Stop interrupting me during meetings.",
        "Your order was cancelled because you didn't pay.", "Move your boxes out of the hallway.",
        "No, you can't take Friday off.", "This design looks cheap.", "Return the book you borrowed.",
        "I'm busy. Talk to me later.",
    ],
    "eval": ["Your report has too many mistakes. Redo it.", "Don't touch the things on my desk."],
}
LIVELY = ["Make this sound more exciting:", "Rewrite this to be more engaging for social media:",
          "Make this description more vivid:", "Can you make this sentence more fun to read?"]
LIVELY_POOL = {
    "train": [
        "Our shop is having a sale this weekend.", "The museum has a new dinosaur exhibit.",
        "We went hiking and saw a waterfall.", "The new phone has a good camera.", "Our restaurant now serves breakfast.",
        "The school is holding a science fair next month.", "I finished my first marathon yesterday.",
        "The band will play in the park on Saturday.", "We added new flavours to our ice cream menu.",
        "The library is starting a summer reading challenge.", "This backpack has many pockets and is waterproof.",
        "Our team won the local football tournament.", "The gym is open later on weekdays now.",
        "The town is having a fireworks show on Friday night.", "Our bakery makes fresh bread every morning.",
        "The park has a new playground.", "We are launching a podcast about local history.",
        "The hotel has a pool and a view of the mountains.", "The city marathon is looking for volunteers.",
        "Our app can now track your sleep.", "The art class meets every Tuesday evening.",
        "We planted a garden on the roof of our office.", "The concert tickets go on sale tomorrow.",
        "Our dog learned a new trick.", "The farm lets visitors pick their own strawberries.",
    ],
    "eval": ["The café has a new cake on the menu.", "Our town has a lake where you can rent boats."],
}
REWRITE = [(layouts(FORMAL), FORMAL_POOL), (layouts(SIMPLER), SIMPLER_POOL), (layouts(SHORTER), SHORTER_POOL),
           (layouts(GRAMMAR), GRAMMAR_POOL), (layouts(POLITE), POLITE_POOL), (layouts(LIVELY), LIVELY_POOL)]

# ---------------------------------------------------------------------------------------------
# multi-turn: (user, short assistant reply, a follow-up about that reply). Train rows also ask
# generic follow-ups, which fit any reply.

FOLLOW_UPS = [
    "Can you make that shorter?", "Could you explain that more simply?", "Can you give me an example?",
    "Thanks! Could you put that as a short list?", "What's the single most important point there?",
    "Can you say that in one sentence?", "Is there a common mistake people make with this?",
    "Could you explain it as if I were twelve?",
]
CONVERSATIONS = {
    "train": [
        ("What's a good way to start learning to cook?",
         "Start with a few simple dishes you enjoy, like pasta, omelettes or stir-fries, and make them several "
         "times until they feel easy. Learning basic knife skills and how to season with salt early on helps a lot.",
         "Which dish would you suggest I try first?"),
        ("Can you recommend a houseplant that's hard to kill?",
         "A snake plant is a great choice. It tolerates low light, only needs watering every two or three weeks, "
         "and handles being forgotten quite well.",
         "What about one that's safe for cats?"),
        ("How many hours of sleep does a teenager need?",
         "Most teenagers need about eight to ten hours of sleep a night. Many get less because of early school "
         "start times and late screen use.",
         "What can parents do to help them get more?"),
        ("What's the capital of Australia?",
         "The capital of Australia is Canberra, not Sydney as many people assume. It was chosen as a compromise "
         "between Sydney and Melbourne.",
         "When did it become the capital?"),
        ("Write a Python one-liner that squares every number in a list called nums.",
         "You can use a list comprehension: squares = [n * n for n in nums]",
         "How would I keep only the squares that are even?"),
        ("What is 15% of 80?", "15% of 80 is 12, because 0.15 × 80 = 12.",
         "And what would 80 be after a 15% increase?"),
        ("Give me a name idea for a cat.",
         "How about Biscuit? It's friendly, easy to call out, and suits a cat of almost any colour.",
         "Something a bit more elegant, please."),
        ("How do I boil an egg so the yolk is still runny?",
         "Lower the egg into boiling water and cook it for about six minutes, then put it in cold water for a "
         "minute to stop the cooking.",
         "How long for a fully hard-boiled one?"),
        ("What does a router do?",
         "A router connects your devices to the internet and to each other. It directs data between your home "
         "network and your internet provider, usually over Wi-Fi or cables.",
         "Is it the same thing as a modem?"),
        ("I want to run a 5K in two months. Is that realistic for a beginner?",
         "Yes, that's realistic for most healthy beginners. A run-walk plan three times a week, slowly increasing "
         "the running parts, usually gets people there in eight weeks.",
         "What should a first week look like?"),
        ("Translate 'good morning' into Spanish.", "'Good morning' in Spanish is 'buenos días'.",
         "How would I say 'good night'?"),
        ("What's the difference between 'its' and 'it's'?",
         "'It's' is short for 'it is' or 'it has', while 'its' shows possession, as in 'the dog wagged its tail'.",
         "Can you give me a sentence that uses both?"),
        ("How can I make my coffee less bitter?",
         "Try slightly coarser grounds, water just below boiling, and a shorter brewing time. Fresher beans and a "
         "pinch of salt can also reduce bitterness.",
         "What if I'm using instant coffee?"),
        ("Suggest a quick vegetarian dinner.",
         "A chickpea and spinach curry takes about twenty minutes: fry onion and garlic, add curry paste, tinned "
         "tomatoes and chickpeas, then stir in spinach at the end. Serve with rice or bread.",
         "Can I make it without curry paste?"),
        ("Why do we have time zones?",
         "Time zones keep clocks roughly in line with the sun, so noon is near the middle of the day everywhere. "
         "They were standardised in the late 1800s, largely because railways needed consistent schedules.",
         "Why do some countries use half-hour time zones?"),
        ("Is it bad to charge my phone overnight?",
         "Modern phones stop charging when the battery is full, so overnight charging is generally fine. Many also "
         "offer an optimised charging setting that reduces long-term battery wear.",
         "Does fast charging damage the battery?"),
        ("What should I pack for a day hike?",
         "Bring water, snacks, a map or a phone with offline maps, sunscreen, a light rain jacket and a small "
         "first-aid kit. Comfortable shoes with good grip matter most.",
         "What if it's in the mountains in autumn?"),
        ("How do I write a function in Python that returns the larger of two numbers?",
         "You can write: def larger(a, b): return a if a > b else b. Python's built-in max(a, b) does the same.",
         "How would I change it to work with any number of arguments?"),
        ("What's a good book for someone who's just getting into science fiction?",
         "'The Martian' by Andy Weir is a great start. It's funny, fast-paced and grounded in real science, so it "
         "doesn't need much background.",
         "Anything similar but older, a classic?"),
        ("A train leaves at 2:15 pm and the trip takes 1 hour 50 minutes. When does it arrive?",
         "It arrives at 4:05 pm. Adding 1 hour gives 3:15, and 50 more minutes gives 4:05.",
         "What if the train is delayed by 25 minutes?"),
        ("How do I politely decline a meeting invitation?",
         "You could say: 'Thanks for the invite. Unfortunately I can't make it at that time, but I'm happy to catch "
         "up on the notes or find another slot.'",
         "What if it's my boss who invited me?"),
        ("What are the symptoms of dehydration?",
         "Common signs include thirst, a dry mouth, dark yellow urine, tiredness, headaches and dizziness. Severe "
         "dehydration can cause confusion and needs medical help.",
         "How much water should I drink when it's hot?"),
        ("Can you explain what a mortgage is?",
         "A mortgage is a loan used to buy property. You repay it with interest over many years, and the home "
         "serves as security, so the lender can take it if payments stop.",
         "What's the difference between a fixed and a variable rate?"),
        ("Give me a fun fact about space.",
         "A day on Venus is longer than its year. Venus takes about 243 Earth days to spin once, but only about 225 "
         "days to orbit the sun.",
         "Wow. Any fun fact about Mars?"),
        ("How do I get rid of fruit flies in my kitchen?",
         "Remove ripe fruit and rubbish, then set a trap: a small dish of apple cider vinegar with a drop of dish "
         "soap. The flies are drawn in and can't escape.",
         "How long does it usually take to get rid of them?"),
        ("What's the best way to memorise a speech?",
         "Break it into sections, learn the main idea of each one, and practise out loud, adding one section at a "
         "time. Rehearsing standing up, in a similar room, helps too.",
         "What if I forget a line in the middle?"),
        ("Convert 5 miles to kilometres.", "5 miles is about 8.05 kilometres, since one mile is roughly 1.609 km.",
         "And how many miles is a 10K race?"),
        ("What does 'break the ice' mean?",
         "To break the ice means to say or do something that relieves tension and gets a conversation started, "
         "especially when people first meet.",
         "Can you give me a good icebreaker for a new team?"),
        ("Should I stretch before or after running?",
         "Light, dynamic movements like leg swings are best before running, while longer static stretches are "
         "better afterwards, when your muscles are warm.",
         "Which stretches help with tight calves?"),
        ("What's a good way to save for a holiday?",
         "Decide on a target and a date, divide the cost by the number of months, and set up an automatic transfer "
         "into a separate savings account on payday.",
         "What if my income is irregular?"),
        ("Who painted the Mona Lisa?",
         "The Mona Lisa was painted by Leonardo da Vinci in the early 1500s. It hangs in the Louvre in Paris.",
         "Why is it so famous?"),
        ("How do I clean a cast iron pan?",
         "Rinse it with hot water and scrub with a brush; a little soap is fine. Dry it completely right away, then "
         "rub in a thin layer of oil to protect it.",
         "What should I do if it's already rusty?"),
        ("Can you suggest a short stretching routine for my desk job?",
         "Try neck rolls, shoulder shrugs, a seated twist each way and a standing hamstring stretch, holding each "
         "for about twenty seconds. Doing it twice a day helps.",
         "How often should I get up from my desk?"),
        ("What's the plural of 'cactus'?",
         "Both 'cacti' and 'cactuses' are correct. 'Cacti' is more common in writing, while 'cactuses' is often "
         "heard in everyday speech.",
         "What about 'octopus'?"),
        ("I have 12 cupcakes and 5 kids. How many does each get if I share them equally?",
         "Each child gets 2 cupcakes, and 2 are left over, since 5 × 2 = 10.",
         "What could I do with the two extras so it's fair?"),
        ("How do vaccines work?",
         "Vaccines train the immune system by showing it a harmless piece or weakened version of a germ. The body "
         "makes antibodies and memory cells, so it can fight the real infection quickly later.",
         "Why do some vaccines need boosters?"),
        ("What's a polite way to ask a neighbour to trim their tree?",
         "You could say: 'Hi, I hope you're well. The branches from your tree are hanging over our fence a bit. "
         "Would you mind trimming them when you have a chance? Happy to help if that's easier.'",
         "What if they say no?"),
        ("What's the difference between a list and a set in Python?",
         "A list keeps items in order and allows duplicates, while a set is unordered and keeps only unique items. "
         "Checking membership is usually much faster in a set.",
         "When would I use a tuple instead?"),
        ("Recommend a board game for a family with young kids.",
         "Try 'Ticket to Ride: First Journey'. The rules are simple, games are short, and kids from about six can "
         "play with adults without it feeling too easy.",
         "Something cooperative instead of competitive?"),
        ("How long should I steep green tea?",
         "Green tea usually needs two to three minutes in water around 75 to 80 °C. Hotter water or longer "
         "steeping makes it bitter.",
         "And black tea?"),
        ("Why does my bread come out dense?",
         "Dense bread often comes from not kneading enough, not letting the dough rise long enough, or using old "
         "yeast. Too much flour can also make it heavy.",
         "How can I tell when the dough has risen enough?"),
        ("What are some good habits for studying?",
         "Study in short focused sessions with breaks, test yourself instead of just rereading, and spread practice "
         "over several days rather than cramming the night before.",
         "How long should each session be?"),
        ("Explain what an API is in one sentence.",
         "An API is a set of rules that lets one piece of software ask another for data or services without knowing "
         "how it works inside.",
         "Can you give an everyday example?"),
        ("How do I remove a red wine stain from a carpet?",
         "Blot, don't rub, with a clean cloth, then pour a little cold water on it and blot again. A mix of dish "
         "soap, white vinegar and warm water usually lifts what's left.",
         "What if the stain has already dried?"),
        ("What's the tallest mountain in the world?",
         "Mount Everest is the tallest above sea level, at about 8,849 metres. Measured from base to peak, Mauna Kea "
         "in Hawaii is taller, but much of it is underwater.",
         "How long does it take to climb Everest?"),
        ("I need a birthday message for my grandmother, who is turning 90.",
         "Happy 90th birthday, Grandma! Thank you for all the stories, hugs and wisdom over the years. We love you "
         "more than words can say.",
         "Can you make it a bit funnier?"),
        ("What's a simple way to explain fractions to a child?",
         "Use a pizza: if you cut it into four equal slices, each slice is one quarter. Eating three slices means "
         "you ate three quarters of the pizza.",
         "How would I explain adding fractions then?"),
        ("How do I make my Wi-Fi faster at home?",
         "Put the router in a central, open spot away from walls and microwaves, restart it now and then, and use "
         "the 5 GHz band for devices close by. A mesh system helps in larger homes.",
         "Should I upgrade my internet plan instead?"),
        ("What should I do if I lock myself out of my house?",
         "First check for an unlocked window or a spare key with a neighbour or family member. If that fails, call "
         "a licensed locksmith rather than forcing a door or window.",
         "How can I avoid this happening again?"),
    ],
    "eval": [
        ("What's a good first instrument for an adult beginner?",
         "The ukulele is a great choice. It's small, cheap, has only four strings, and you can play simple songs "
         "within a few days.",
         "How long would it take to learn a few songs?"),
        ("How do I keep cut flowers fresh longer?",
         "Trim the stems at an angle, change the water every two days, remove leaves below the waterline, and keep "
         "the vase away from direct sun and ripe fruit.",
         "Does adding sugar to the water help?"),
        ("What's 3/4 as a percentage?", "3/4 is 75%, because 3 divided by 4 is 0.75.", "And 5/8?"),
        ("Why do cats knock things off tables?",
         "Cats often do it out of curiosity, to play, or to get attention. Batting at small objects also mimics "
         "hunting behaviour.",
         "How can I get mine to stop?"),
        ("Can you suggest a weekend activity for a rainy day with friends?",
         "Host a cooking challenge: everyone brings one surprise ingredient, then you split into teams to make a "
         "dish using them all. It's cheap and usually very funny.",
         "Any ideas that don't involve food?"),
        ("What's the fastest land animal?",
         "The cheetah is the fastest land animal, reaching around 100 to 110 kilometres per hour in short bursts.",
         "How long can it keep that speed up?"),
        ("How do I check in Python whether a number is odd?",
         "Use the remainder operator: def is_odd(n): return n % 2 == 1. It works for negative numbers too, because "
         "Python's % never returns a negative result for a positive divisor.",
         "How would I test it quickly?"),
        ("What's a good way to start journaling?",
         "Keep it small: write three sentences each evening about what happened, how you felt and one thing you're "
         "grateful for. A fixed time makes the habit stick.",
         "What if I miss a few days?"),
        ("How many minutes are there in a week?", "There are 10,080 minutes in a week: 60 × 24 × 7.",
         "And how many seconds?"),
        ("What is a haiku?",
         "A haiku is a short Japanese poem of three lines, traditionally of five, seven and five syllables, often "
         "about nature or a season.",
         "Could you write one about the sea?"),
        ("How should I prepare for a long flight?",
         "Wear comfortable layers, bring a refillable water bottle, headphones and snacks, and get up to walk and "
         "stretch every couple of hours.",
         "Any tips to beat jet lag after landing?"),
        ("What does 'serendipity' mean?",
         "Serendipity means finding something good or useful by chance, without looking for it.",
         "Can you use it in a sentence?"),
        ("How do I teach my kid to ride a bike?",
         "Lower the seat and take the pedals off so they can push along and practise balancing. Once they can "
         "glide, put the pedals back and steady them by the shoulders, not the bike, as they start.",
         "What if they're scared of falling?"),
        ("What's the boiling point of water at the top of a mountain?",
         "It's lower than 100 °C because the air pressure is lower. On a 3,000-metre mountain, water boils at "
         "roughly 90 °C.",
         "Does that mean pasta takes longer to cook there?"),
        ("Suggest a name for a small hiking club.",
         "How about 'The Trail Mix'? It's friendly, a little playful and easy to remember.",
         "Can you give me a few more options?"),
        ("How do I stop my glasses from fogging up when I wear a mask?",
         "Pinch the mask's nose wire so it fits snugly, and rest the glasses on top of the mask's upper edge. "
         "Washing the lenses with soapy water and letting them air-dry also helps.",
         "What about in cold weather outside?"),
    ],
}

# ---------------------------------------------------------------------------------------------


def reuse(kind: str, split: str) -> int:
    return TRAIN_REUSE[kind] if split == "train" else 1


def deal(rng: random.Random, options: list) -> Iterator:
    """Endless draws from `options` in freshly shuffled rounds, so every phrasing is used about equally."""
    while True:
        yield from rng.sample(options, len(options))


def numbers(rng: random.Random) -> dict[str, int]:
    c = rng.randint(2, 9)
    return dict(a=rng.randint(20, 90), b=rng.randint(2, 19), c=c, m=c * rng.randint(3, 12), p=rng.randint(2, 15))


def math_rows(split: str, rng: random.Random) -> list[dict]:
    asks = deal(rng, MATH_ASKS)
    rows = []
    for problem in MATH[split]:
        for _ in range(reuse("math", split)):
            name, other = rng.sample(NAMES[split], 2)
            rows.append({"prompt": next(asks).format(problem.format(name=name, other=other, **numbers(rng)))})
    return rows


def code_rows(split: str, rng: random.Random) -> list[dict]:
    rows = []
    for sig, task in WRITE_TASKS[split]:
        for ask in rng.sample(WRITE_ASKS, reuse("code-write", split)):
            rows.append({"prompt": ask.format(sig=sig, name=sig.split("(")[0], task=task)})
    explain, fix = deal(rng, EXPLAIN_ASKS), deal(rng, FIX_ASKS)
    rows += [{"prompt": next(explain).format(code)} for code in EXPLAIN_SNIPPETS[split]]
    rows += [{"prompt": next(fix).format(goal=goal, code=code)} for goal, code in FIX_SNIPPETS[split]]
    return rows


def phrased_rows(kinds: list[tuple[list[str], dict]], split: str, rng: random.Random) -> list[dict]:
    """One row per item of each kind's pool, in one of the kind's phrasings (a pair fills two slots)."""
    rows = []
    for phrasings, pool in kinds:
        asks = deal(rng, phrasings)
        rows += [{"prompt": next(asks).format(*(item if isinstance(item, tuple) else (item,)))} for item in pool[split]]
    return rows


def summarize_rows(split: str, rng: random.Random) -> list[dict]:
    return [{"prompt": ask.format(paragraph)} for paragraph in PARAGRAPHS[split]
            for ask in rng.sample(SUMMARIZE_ASKS, reuse("summarize", split))]


def multi_turn_rows(split: str, rng: random.Random) -> list[dict]:
    rows = []
    for user, reply, follow_up in CONVERSATIONS[split]:
        for last in [follow_up, *rng.sample(FOLLOW_UPS, reuse("multi-turn", split) - 1)]:
            rows.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply},
                                      {"role": "user", "content": last}]})
    return rows


CATEGORIES: dict[str, Callable[[str, random.Random], list[dict]]] = {
    "math": math_rows, "code": code_rows, "chat": partial(phrased_rows, CHAT), "summarize": summarize_rows,
    "rewrite": partial(phrased_rows, REWRITE), "multi-turn": multi_turn_rows,
}
# The wording both splits share: every phrasing a row is built with ({...} marks where content goes)
# and the generic follow-ups. All else in a prompt comes from its split's pools.
SHARED_PHRASINGS = [*MATH_ASKS, *WRITE_ASKS, *EXPLAIN_ASKS, *FIX_ASKS, *SUMMARIZE_ASKS, *FOLLOW_UPS,
                    *(phrasing for kinds in (CHAT, REWRITE) for phrasings, _ in kinds for phrasing in phrasings)]
SPLIT_POOLS = [NAMES, MATH, WRITE_TASKS, EXPLAIN_SNIPPETS, FIX_SNIPPETS, PARAGRAPHS, CONVERSATIONS,
               *(pool for _, pool in CHAT), *(pool for _, pool in REWRITE)]


def check_disjoint() -> None:
    """Refuse a pool whose train and eval lists share an item, and a paragraph outside 60-120 words."""
    for pool in SPLIT_POOLS:
        if shared := set(pool["train"]) & set(pool["eval"]):
            raise ValueError(f"in both splits: {sorted(shared)[:3]}")
    for paragraph in PARAGRAPHS["train"] + PARAGRAPHS["eval"]:
        if not 60 <= len(paragraph.split()) <= 120:
            raise ValueError(f"paragraph of {len(paragraph.split())} words: {paragraph[:60]!r}")


def rows(split: str) -> list[dict]:
    """All rows of `split`, the categories interleaved (math, code, chat, ...) so that the first n
    rows of a split cover every category; within a category, shuffled."""
    per_category = []
    for category, build in CATEGORIES.items():
        rng = random.Random(f"{SEED}-{category}-{split}")
        built = build(split, rng)
        rng.shuffle(built)
        per_category.append([{"category": category, "split": split, **row} for row in built])
    longest = max(map(len, per_category))
    return [group[i] for i in range(longest) for group in per_category if i < len(group)]


def generate() -> str:
    """The JSONL text: train rows, then eval rows; refuses duplicate prompts."""
    check_disjoint()
    all_rows = [row for split in SPLITS for row in rows(split)]
    texts = [json.dumps(row.get("prompt") or row["messages"], ensure_ascii=False) for row in all_rows]
    if len(set(texts)) != len(texts):
        raise ValueError("duplicate prompts")
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in all_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    out = parser.parse_args().out
    out.write_text(generate(), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
