"""dsahal.conformance: the property-based conformance suite every backend is certified against.

Run it as ``dsahal conformance --backend NAME`` or ``pytest --pyargs dsahal.conformance
--dsahal-backend NAME``. Layout (after array-api-tests): ``strategies.py`` draws case
parameters over each op's valid domain, ``cases.py``/``paged.py`` turn parameters into tensors
(deterministically, so a failure is reproducible from the parameters alone),
``assertions.py`` checks properties with rich messages, one ``test_<op>.py`` per op family.
The test modules import this package by its absolute name only: pytest may import them under
another name, and the suite's state must be shared with the plugin.
"""
