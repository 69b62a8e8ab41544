#!/bin/bash
cd /app && echo "$(cat key.txt)" > notes.txt
