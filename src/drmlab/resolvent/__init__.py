"""resolvent"""
