"""The lab: simulators and fault injection, run from a checkout of ursa.

Not in the ``ursa-fl`` wheel (nor is ``ursa.bench``): the product never imports
it, and ``ursa simulate`` from an installed wheel says it needs a checkout.
"""
