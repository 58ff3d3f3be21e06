"""Donation: the hazards of a call's buffers and the consumed class of a donated ``jc.state``."""
