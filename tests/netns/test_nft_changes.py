"""The differ's walks (tests/unit/kernel/nftables/test_nft_changes.py) on the real kernel: libnftables in a
throwaway namespace accepts every batch `Changes.text` writes, in its order, and the table it
lists back afterwards has no difference left from the wanted one (element comments, verdict
maps, recreated sets, foreign objects and a rebuild included)."""
from __future__ import annotations

import pytest

from netagent.kernel.nftables.runner import NftRunner
from tests.unit.kernel.nftables import test_nft_changes as walks


@pytest.fixture
def nft(netns):
    runner = NftRunner(netns)
    walks.converge(runner, walks.table())
    yield runner
    runner.close()


test_an_element_change_writes_only_that_element = walks.test_an_element_change_writes_only_that_element
test_an_element_comment_or_map_value_change_replaces_the_element = \
    walks.test_an_element_comment_or_map_value_change_replaces_the_element
test_a_new_chain_and_the_element_naming_it_come_in_an_order_the_batch_accepts = \
    walks.test_a_new_chain_and_the_element_naming_it_come_in_an_order_the_batch_accepts
test_a_chain_no_longer_wanted_is_flushed_and_deleted_after_its_elements = \
    walks.test_a_chain_no_longer_wanted_is_flushed_and_deleted_after_its_elements
test_a_changed_rule_rewrites_its_chain_only = walks.test_a_changed_rule_rewrites_its_chain_only
test_a_set_of_another_type_is_recreated_and_the_chains_using_it_rewritten = \
    walks.test_a_set_of_another_type_is_recreated_and_the_chains_using_it_rewritten
test_a_base_chain_with_another_priority_rebuilds_the_table = walks.test_a_base_chain_with_another_priority_rebuilds_the_table
test_objects_not_ours_are_deleted_and_unwritable_ones_rebuild = \
    walks.test_objects_not_ours_are_deleted_and_unwritable_ones_rebuild
