"""The hostile-device suite: one compromised device against the real fleet.

Each module takes one family of contributions a device can make (model
updates, decrypted means, selection, key epochs, broker and transfers,
refusals) and asserts the honest fleet's outcome when one device breaks the
rules: the model stays finite and within the documented bound, honest devices
keep their selection share, no extra key epoch starts, honest uploads pass.
See docs/bounded_influence.md for the bounds.
"""
