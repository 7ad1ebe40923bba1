"""The peer engines this project is measured against: llama.cpp, built here from its pinned source."""
