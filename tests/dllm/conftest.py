import pytest

from dllm.testing import tiny_dream, tiny_llada


@pytest.fixture
def llada():
    return tiny_llada()


@pytest.fixture
def dream():
    return tiny_dream()

