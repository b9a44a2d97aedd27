"""sporenet.android_demo"""
